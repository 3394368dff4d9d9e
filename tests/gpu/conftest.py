"""Fixtures for tests that need a CUDA device (all marked ``gpu``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cudapatch import Block, BlockBuilder, Engine
from cudapatch.kernels import PtxFileSource

KERNELS = Path(__file__).parent / "kernels"


class Spin(Block):
    """Busy-waits ``Cycles`` GPU clock cycles (to prove the frame path does not wait)."""

    type_name = "Spin"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(PtxFileSource(KERNELS / "spin.ptx"))
        b.output("Out", k.out(0), size=32)
        b.scalar("Cycles", k.in_(1), default=1000)
        k.auto_grid(32, count_param=2)


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()
