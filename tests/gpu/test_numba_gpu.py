"""A Numba kernel with several arrays and scalars in the graph, against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Block, BlockBuilder, Engine, NumbaSource
from cudapatch.blocks import like

cuda = pytest.importorskip("numba.cuda")
pytestmark = pytest.mark.gpu


def _rand(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def _saxpy(out, x, y, a, n):  # noqa: ANN001 - a Numba kernel
    i = cuda.grid(1)
    if i < n:
        out[i] = a * x[i] + y[i]


class Saxpy(Block):
    """``out = a * x + y`` written in Python and compiled by Numba."""

    type_name = "Saxpy"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(
            NumbaSource(_saxpy, ("float32[:]", "float32[:]", "float32[:]", "float32", "int32"), outputs=("out",))
        )
        b.input("X", k.in_(1))
        b.input("Y", k.in_(2))
        b.output("Out", k.out(0), size=like("X"))
        b.scalar("A", k.in_(3), default=1.0)
        k.auto_grid(like("X"), count_param=4)


def test_numba_kernel_with_several_arrays_and_scalars(engine: Engine, rng: np.random.Generator) -> None:
    n = 100_003
    x, y = _rand(rng, n), _rand(rng, n)
    s = engine.add(Saxpy(name="saxpy", A=-1.5))
    engine.bind(s, "X", x)
    engine.bind(s, "Y", y)
    engine.update()
    engine.output(s, "Out").fill_bytes(0xFF)
    engine.update()
    np.testing.assert_allclose(engine.read(s, "Out"), -1.5 * x.astype(np.float64) + y, rtol=1e-5, atol=1e-6)
    s.set("A", 0.25)  # Hot update through the expanded ABI
    engine.update()
    np.testing.assert_allclose(engine.read(s, "Out"), 0.25 * x.astype(np.float64) + y, rtol=1e-5, atol=1e-6)
    y2 = _rand(rng, n // 2)  # a smaller input: nitems/shape slots are patched too
    x2 = _rand(rng, n // 2)
    engine.bind(s, "X", x2)
    engine.bind(s, "Y", y2)
    engine.update()
    np.testing.assert_allclose(engine.read(s, "Out"), 0.25 * x2.astype(np.float64) + y2, rtol=1e-5, atol=1e-6)
