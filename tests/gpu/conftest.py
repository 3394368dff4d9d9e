"""Fixtures for tests that need a CUDA device (all marked ``gpu``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cudapatch import Block, BlockBuilder, Engine
from cudapatch.kernels import PtxFileSource
from cudapatch.kernels._driver import check, driver

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
    """An engine whose update() waits for kernel compiles: deterministic frames for result checks."""
    e = Engine(wait_for_compile=True)
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
def unfused_engine() -> Iterator[Engine]:
    """``engine`` with fusion off (``Engine(fuse=False)``): every block on nodes of its own, for tests of
    one block's node, buffer or tier (fused counterparts: test_fusion_gpu.py)."""
    e = Engine(wait_for_compile=True, fuse=False)
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
def live_engine(tmp_path) -> Iterator[Engine]:
    """An engine as a live host runs it: compiles in the background, a fresh kernel cache."""
    e = Engine(cache_dir=tmp_path / "kernel-cache")
    try:
        yield e
    finally:
        e.close()


def run_until(engine: Engine, predicate, timeout: float = 30.0, sleep: float = 0.002) -> int:
    """Run frames until ``predicate()`` holds; returns the number of frames it took."""
    import time

    deadline = time.monotonic() + timeout
    frames = 0
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached after {frames} frames ({timeout} s)")
        engine.update()
        frames += 1
        time.sleep(sleep)
    return frames


def stream_idle(engine: Engine) -> bool:
    """Whether every piece of work queued on the engine's stream is done (``cuStreamQuery``)."""
    d = driver()
    (err,) = d.cuStreamQuery(engine.device.stream)
    if err == d.CUresult.CUDA_ERROR_NOT_READY:
        return False
    check((err,), "cuStreamQuery")
    return True


class StreamMark:
    """An event recorded on the engine's stream behind the work queued so far: ``pending()`` says
    whether that work still runs. Whether a call waited for the GPU is then a fact the driver states
    (the event reached or not), not a host time compared with a bound."""

    def __init__(self, engine: Engine) -> None:
        d = driver()
        self._event = check(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING.value), "cuEventCreate")
        check(d.cuEventRecord(self._event, engine.device.stream), "cuEventRecord")

    def pending(self) -> bool:
        d = driver()
        (err,) = d.cuEventQuery(self._event)
        if err == d.CUresult.CUDA_ERROR_NOT_READY:
            return True
        check((err,), "cuEventQuery")
        return False

    def close(self) -> None:
        check(driver().cuEventDestroy(self._event), "cuEventDestroy")

    def __enter__(self) -> StreamMark:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()
