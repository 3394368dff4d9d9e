"""A planted illegal-address kernel in an isolated engine, N trials in one host process: run by
test_isolated_gpu.py in a process of its own (the host must survive; its own CuPy work too).

Usage: python isolated_fault_scenario.py [TRIALS] [--in-for]   (prints OK and the restart times at the end)

``--in-for``: the faulting block runs inside a ``For`` body (three iterations a frame); the fault is
found by the engine process's replay (which runs each body once) and named the same way.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from cudapatch import Engine, Fill, For, Scale
from cudapatch.blocks.block import Block
from cudapatch.blocks.library import CustomKernel

BAD = (Path(__file__).resolve().parent / "kernels" / "illegal_address.cu").read_text()


def faulting_patch(engine: Any, *, in_for: bool = False) -> tuple[Block, Block, Block | None]:
    """Add the trial's patch to ``engine``: fill (2) -> 'bad' (the illegal-address kernel: out = in + 1,
    until a Hot edit sets its ``trigger`` to 1) -> after (x 3 + 1): 10 before the fault, 1 once 'bad'
    is disabled. ``in_for``: 'bad' runs in a ``For`` body (three iterations a frame) beside a Fill.
    Also ``benchmarks/bench_isolated.py``'s patch.

    Returns:
        ``(bad, after, loop)``; ``loop`` is None without ``in_for``.
    """
    fill = engine.add(Fill(name="fill", Count=4096, Value=2.0))
    loop = engine.add(For(name="loop", Count=3)) if in_for else None
    if loop is not None:  # the body keeps a block running once 'bad' is disabled
        engine.add(Fill(name="beside", Count=64, Value=1.0), region=loop)
    bad = engine.add(CustomKernel(name="bad", Code=BAD), region=loop)
    bad.set("trigger", 0.0)
    after = engine.add(Scale(name="after", Factor=3.0, Offset=1.0))
    engine.connect(fill, "Out", bad, "in")
    engine.connect(bad, "out", after, "In")
    return bad, after, loop


def host_work(rng: np.random.Generator) -> None:
    """The host's own CUDA work: must give the right result before and after every fault."""
    import cupy as cp  # here, not at the top: the benchmark imports this module where CuPy may be missing

    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float32)
    got = cp.asnumpy(cp.asarray(a) @ cp.asarray(b))
    assert np.allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-3)


def trial(rng: np.random.Generator, in_for: bool = False) -> float:
    host_work(rng)
    engine = Engine(isolated=True, wait_for_compile=True)
    try:
        bad, after, loop = faulting_patch(engine, in_for=in_for)
        engine.wait_ready()
        for _ in range(3):
            engine.update()
        assert np.allclose(engine.read(after, "Out"), 10.0)  # out = in + 1 in every iteration
        if loop is not None:
            assert engine.iterations(loop) == 3
        host_work(rng)

        bad.set("trigger", 1.0)  # a Hot edit that makes the kernel fault in the child
        deadline = time.monotonic() + 120
        while engine.restarts == 0 and time.monotonic() < deadline:
            engine.update()
            time.sleep(0.001)
        assert engine.restarts == 1, engine
        noticed = time.perf_counter()
        host_work(rng)  # the host's CUDA is untouched
        faults = [d for d in engine.diagnostics() if d.code == "gpu-fault"]
        assert len(faults) == 1 and faults[0].block_id == bad.id and "'bad'" in faults[0].message, faults
        assert str(bad).startswith("bad: Error")
        # Runs again: the new child builds without 'bad' (its output reads zeros: 0 * 3 + 1).
        while time.monotonic() < deadline:
            engine.update()
            try:
                out = engine.output(after, "Out")
            except Exception:
                time.sleep(0.001)
                continue
            engine.synchronize()
            if np.allclose(out.download(), 1.0):
                break
        runs_again = time.perf_counter() - noticed
        assert np.allclose(engine.read(after, "Out"), 1.0)
        host_work(rng)
        return runs_again
    finally:
        engine.close()


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    trials = int(args[0]) if args else 20
    rng = np.random.default_rng()
    times = [trial(rng, in_for="--in-for" in sys.argv) for _ in range(trials)]
    host_work(rng)
    print("OK", " ".join(f"{t:.3f}" for t in times))


if __name__ == "__main__":
    main()
