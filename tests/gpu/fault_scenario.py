"""A kernel that writes to an illegal address while the patch runs: run by test_fault_gpu.py in its
own process, because the fault resets the device's primary context for the whole process.

Usage: python fault_scenario.py [--debug-launch] [--fused-tail] [--in-for]   (prints OK at the end)

``--fused-tail``: a second Scale after ``after``, so that ``after`` runs in a fused kernel with it
(elementwise fusion, the engine's default): the fault is still named on ``bad``, the block that makes
it, and the fused group reads its zeros.

``--in-for``: ``bad`` runs inside a ``For`` body (three iterations a frame, beside another block): the
replay (which runs each body once) names it the same way.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from cudapatch import Engine, Fill, For, Scale
from cudapatch.blocks.library import CustomKernel

BAD = (Path(__file__).resolve().parent / "kernels" / "illegal_address.cu").read_text()
GOOD = BAD.replace("if (trigger > 0.5f && i == 0) *((volatile float*)(size_t)8) = 1.0f;", "")


def main() -> None:
    debug = "--debug-launch" in sys.argv
    engine = Engine(wait_for_compile=True, debug_launch=debug, cache_dir=False)
    fill = engine.add(Fill(name="fill", Count=4096, Value=2.0))
    loop = engine.add(For(name="loop", Count=3)) if "--in-for" in sys.argv else None
    if loop is not None:  # the body keeps a block running once 'bad' is disabled
        engine.add(Fill(name="beside", Count=64, Value=1.0), region=loop)
    bad = engine.add(CustomKernel(name="bad", Code=BAD), region=loop)
    bad.set("trigger", 0.0)
    after = engine.add(Scale(name="after", Factor=3.0, Offset=1.0))
    engine.connect(fill, "Out", bad, "in")
    engine.connect(bad, "out", after, "In")
    last, scale = after, 1.0  # the block read, and what it multiplies after's values by
    if "--fused-tail" in sys.argv:
        last, scale = engine.add(Scale(name="tail", Factor=0.5)), 0.5
        engine.connect(after, "Out", last, "In")
    engine.wait_ready()
    for _ in range(3):
        engine.update()
    if last is not after:
        assert engine.graph.plan.block_nodes[after.id] == engine.graph.plan.block_nodes[last.id]  # one fused kernel
    assert np.allclose(engine.read(last, "Out"), 10.0 * scale)  # out = in + 1 in every iteration
    if loop is not None and not debug:  # a debug launch runs each body once
        assert engine.iterations(loop) == 3

    bad.set("trigger", 1.0)  # a Hot edit that makes the kernel fault
    deadline = time.monotonic() + 60
    while engine.counters.faults == 0 and time.monotonic() < deadline:
        engine.update()  # the fault surfaces a frame or two later; the block is found
        time.sleep(0.001)
    assert engine.counters.faults == 1, engine.counters
    engine.update()
    diags = engine.diagnostics()
    faults = [d for d in diags if d.code == "gpu-fault"]
    assert len(faults) == 1 and faults[0].block_id == bad.id, diags
    assert "ILLEGAL_ADDRESS" in faults[0].message and "'bad'" in faults[0].message
    assert str(bad).startswith("bad: Error")
    if engine.lost is not None:  # the driver keeps the fault for this process: the engine stops, we do not
        assert "restart" in engine.lost and "block 'bad'" in engine.lost, engine.lost
        assert any(d.code == "gpu-lost" for d in diags)
        for _ in range(3):
            engine.update()  # no launch, no exception
        engine.close()
        print("OK lost")
        return
    assert any(d.block_id == after.id and d.code == "input-faulted" for d in diags), diags
    assert np.allclose(engine.read(last, "Out"), 1.0 * scale)  # zeros from 'bad', then * 3 + 1
    assert str(bad).startswith("bad: Error")
    fill.set("Value", 5.0)  # the rest keeps running and takes edits
    engine.update()
    assert np.allclose(engine.read(fill, "Out"), 5.0)

    bad.set("Code", GOOD)  # fixed code: the block gets a new chance
    engine.wait_ready()
    for _ in range(3):
        engine.update()
    assert np.allclose(engine.read(last, "Out"), 19.0 * scale)  # (5 + 1) * 3 + 1
    assert not [d for d in engine.diagnostics() if d.severity == "error"]
    assert engine.counters.faults == 1
    engine.close()
    print("OK")


if __name__ == "__main__":
    main()
