"""A kernel that writes to an illegal address while the patch runs: run by test_fault_gpu.py in its
own process, because the fault resets the device's primary context for the whole process.

Usage: python fault_scenario.py [--debug-launch]   (prints OK at the end)
"""

from __future__ import annotations

import sys

import numpy as np

from cudapatch import Engine, Fill, Scale
from cudapatch.blocks.library import CustomKernel

BAD = """
extern "C" __global__ void k(const float* in, float* out, float trigger, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + 1.0f;
    if (trigger > 0.5f && i == 0) *((volatile float*)(size_t)8) = 1.0f;   // an illegal address
}"""
GOOD = BAD.replace("if (trigger > 0.5f && i == 0) *((volatile float*)(size_t)8) = 1.0f;", "")


def main() -> None:
    debug = "--debug-launch" in sys.argv
    engine = Engine(wait_for_compile=True, debug_launch=debug, cache_dir=False)
    fill = engine.add(Fill(name="fill", Count=4096, Value=2.0))
    bad = engine.add(CustomKernel(name="bad", Code=BAD))
    bad.set("trigger", 0.0)
    after = engine.add(Scale(name="after", Factor=3.0, Offset=1.0))
    engine.connect(fill, "Out", bad, "in")
    engine.connect(bad, "out", after, "In")
    engine.wait_ready()
    for _ in range(3):
        engine.update()
    assert np.allclose(engine.read(after, "Out"), 10.0)

    bad.set("trigger", 1.0)  # a Hot edit that makes the kernel fault
    for _ in range(6):
        engine.update()  # the fault is found, the context reset, the block disabled
    assert engine.counters.faults == 1, engine.counters
    engine.update()
    diags = engine.diagnostics()
    errors = [d for d in diags if d.severity == "error"]
    assert len(errors) == 1 and errors[0].block_id == bad.id and errors[0].code == "gpu-fault", diags
    assert "ILLEGAL_ADDRESS" in errors[0].message and "'bad'" in errors[0].message
    assert any(d.block_id == after.id and d.code == "input-faulted" for d in diags), diags
    assert np.allclose(engine.read(after, "Out"), 1.0)  # zeros from 'bad', then * 3 + 1
    assert str(bad).startswith("bad: Error")
    fill.set("Value", 5.0)  # the rest keeps running and takes edits
    engine.update()
    assert np.allclose(engine.read(fill, "Out"), 5.0)

    bad.set("Code", GOOD)  # fixed code: the block gets a new chance
    engine.wait_ready()
    for _ in range(3):
        engine.update()
    assert np.allclose(engine.read(after, "Out"), 19.0)  # (5 + 1) * 3 + 1
    assert not [d for d in engine.diagnostics() if d.severity == "error"]
    assert engine.counters.faults == 1
    engine.close()
    print("OK")


if __name__ == "__main__":
    main()
