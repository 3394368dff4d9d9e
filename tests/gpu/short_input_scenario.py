"""Planted short and mis-shaped inputs whose memory is an illegal address: run by test_shapes_gpu.py in
its own process. The plan-time input checks must keep these blocks off the GPU; were one launched,
its first read would fault (and cost this process its CUDA use), so a clean run proves none was.

Usage: python short_input_scenario.py   (prints OK at the end)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests/

from cudapatch import BlockState, Engine, Fill, Scale, VectorAdd  # noqa: E402
from tests.unit.shape_blocks import Transpose2D  # noqa: E402

BAD_PTR = 8  # no allocation lives here: any read faults


class _Planted:
    """Device memory that is not there: an array interface of ``shape`` float32 at ``BAD_PTR``."""

    def __init__(self, *shape: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": "<f4",
            "data": (BAD_PTR, False),
            "version": 3,
            "strides": None,
        }


def main() -> None:
    rng = np.random.default_rng()
    engine = Engine(wait_for_compile=True, cache_dir=False)
    a, b = rng.standard_normal(1 << 16).astype(np.float32), rng.standard_normal(1 << 16).astype(np.float32)
    fill = engine.add(Fill(name="fill", Count=1 << 16, Value=2.0))
    chain = engine.add(Scale(name="chain", Factor=3.0, Offset=1.0))
    engine.connect(fill, "Out", chain, "In")
    add = engine.add(VectorAdd(name="add"))
    after = engine.add(Scale(name="after", Factor=2.0))
    engine.connect(add, "Sum", after, "In")
    engine.bind(add, "A", a)
    engine.bind(add, "B", b)
    t = engine.add(Transpose2D(name="t", Width=64, Height=32))
    img = rng.standard_normal((32, 64)).astype(np.float32)
    engine.bind(t, "In", img)
    engine.wait_ready()
    for _ in range(3):
        engine.update()
    assert np.allclose(engine.read(after, "Out"), (a.astype(np.float64) + b) * 2.0, rtol=1e-5, atol=1e-5)
    assert np.array_equal(engine.read(t, "Out"), img.T)

    engine.bind(add, "B", _Planted(1000))  # 1000 elements where the launch covers 65536
    engine.bind(t, "In", _Planted(64, 32))  # as many elements as (32, 64), the other way round
    for _ in range(5):
        engine.update()
    engine.synchronize()  # a fault of any launch would surface here
    assert engine.counters.faults == 0, engine.counters
    codes = {d.block_id: d.code for d in engine.diagnostics() if d.severity == "error"}
    assert codes == {add.id: "input-short", t.id: "input-shape"}, engine.diagnostics()
    assert add.debug.state is BlockState.ERROR and t.debug.state is BlockState.ERROR
    assert "input 'B' holds 1000 elements but needs 65536" in add.debug.message, add.debug.message
    assert np.allclose(engine.read(chain, "Out"), 7.0)  # the rest of the patch keeps running

    engine.bind(add, "B", b)  # real memory again: both run
    engine.bind(t, "In", img)
    for _ in range(3):
        engine.update()
    assert np.allclose(engine.read(after, "Out"), (a.astype(np.float64) + b) * 2.0, rtol=1e-5, atol=1e-5)
    assert np.array_equal(engine.read(t, "Out"), img.T)
    assert not [d for d in engine.diagnostics() if d.severity == "error"]
    engine.close()
    print("OK")


if __name__ == "__main__":
    main()
