#!/usr/bin/env python3
"""Isolated engine overhead: host microseconds of ``update()`` (clean, and with one Hot value) of an
isolated engine beside a normal engine on the same 20-block chain and a bare ``cuGraphLaunch`` of
that graph, medians in the same run.

Then planted GPU faults, each in a new isolated engine with the illegal-address kernel of
``tests/gpu/isolated_fault_scenario.py``: ``--trials`` (20) after ``--settle`` seconds (2) of 60 fps
frames, a running engine; then ``--start-trials`` (10) in the engine's first frames, where the
child's fault replay process may still be starting. Per trial and as median and max: the time from
the fault to the host noticing it (the child's replay names the block and reports; the host starts
a new child), the medians of each step on the way (``fault_times``), and to the engine running again
(a correct frame from the new child, which builds without the block, read here); whether the block
was named, and whether the host's own CuPy work before, after the fault and after the restart gave
the right results. Target: running again within 1 s of the fault in every trial.

Then the peers on this machine right after the faults: a new process's CUDA context (init, primary
context, an allocation, a synchronize), which any replay in another process needs, timed inside
that process and from its start to its exit; and a bare process's fault: an illegal-address launch
to its error (a floor of both the fault surfacing and the replay meeting it again), and that error
to the process's exit (the driver's teardown).

Usage: ``python benchmarks/bench_isolated.py [--trials N] [--settle S] [--start-trials M]
[--no-fault]``; writes ``isolated.json`` to ``$RESULTS_DIR`` when set. Run the fault part on a
machine whose later GL previews do not matter (docs/faults.md, "After a fault, on that machine").
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from _timing import host_us  # noqa: E402

from cudapatch import Engine, Fill, Scale  # noqa: E402
from cudapatch.kernels._driver import check, driver  # noqa: E402
from tests.gpu.isolated_fault_scenario import faulting_patch  # noqa: E402

BLOCKS = 20


def chain(e):
    prev = e.add(Fill(name="f", Count=4096, Value=1.0))
    first = None
    for i in range(BLOCKS - 1):
        s = e.add(Scale(name=f"s{i}", Factor=1.0001))
        e.connect(prev, "Out", s, "In")
        prev, first = s, first or s
    e.wait_ready()
    for _ in range(3):
        e.update()
    e.synchronize()
    return first


def hot(e, block):
    values = iter(range(10**9))

    def step():
        block.set("Factor", 1.0 + next(values) % 7 * 1e-4)
        e.update()

    return step


PHASE_DEADLINE_S = 30.0  # a phase that takes longer is reported as not reached, and the trial ends
TARGET_S = 1.0  # the engine runs again within this long of the fault
HAVE_CUPY = importlib.util.find_spec("cupy") is not None


@dataclass
class FaultTrial:
    """One planted fault, timed from the Hot edit that makes the child's next frame fault (the fault
    itself comes with that frame, a little later: the times are upper bounds)."""

    noticed_s: float | None = None  # the edit -> ``engine.restarts`` counts the child's end
    running_s: float | None = None  # the edit -> a correct frame from the rebuilt child, read here
    named: bool = False  # one ``gpu-fault`` diagnostic, on 'bad', naming it
    host_ok: bool | None = None  # the host's CuPy work right before, after the fault and after the restart;
    # None: not checked (no CuPy, or the trial ended first)
    error: str = ""
    steps: dict[str, float] = field(default_factory=dict)  # seconds of each step of the fault (``STEPS``)

    @property
    def within_target(self) -> bool:
        return self.running_s is not None and self.running_s <= TARGET_S


def _host_work(rng: np.random.Generator) -> bool | None:
    """The host's own CUDA work (CuPy, in this process): True if right, None without CuPy."""
    if not HAVE_CUPY:
        return None
    import cupy as cp

    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float32)
    try:
        got = cp.asnumpy(cp.asarray(a) @ cp.asarray(b))
    except Exception as exc:  # the host's CUDA met the fault: what this benchmark is here to catch
        print(f"  host CuPy work failed: {exc}")
        return False
    return bool(np.allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-3))


def _all_ok(checks: list[bool | None]) -> bool | None:
    return None if None in checks else all(checks)


def fault_trial(rng: np.random.Generator, settle_s: float) -> FaultTrial:
    """Plant the fault in a new isolated engine (``isolated_fault_scenario.faulting_patch``, as its
    ``trial`` does), after ``settle_s`` seconds of 60 fps frames, and time it (no assertions: each
    outcome is reported)."""
    result = FaultTrial()
    checks = [_host_work(rng)]
    engine = Engine(isolated=True, wait_for_compile=True)
    try:
        bad, after, _ = faulting_patch(engine)
        engine.wait_ready()
        for _ in range(3):
            engine.update()
        settled = time.perf_counter() + settle_s
        while time.perf_counter() < settled:  # a running engine: its processes have settled
            engine.update()
            time.sleep(1 / 60)
        if not np.allclose(engine.read(after, "Out"), 10.0):  # (2 + 1) * 3 + 1 before the fault
            result.error = "wrong output before the fault"
            return result

        bad.set("trigger", 1.0)  # a Hot edit that makes the kernel fault in the child
        edited = time.monotonic()
        t0 = time.perf_counter()
        while engine.restarts == 0 and time.perf_counter() - t0 < PHASE_DEADLINE_S:
            engine.update()
            time.sleep(0.001)
        if engine.restarts == 0:
            result.error = f"no restart within {PHASE_DEADLINE_S:.0f} s"
            return result
        result.noticed_s = time.perf_counter() - t0
        result.steps = fault_steps(edited, engine.fault_times)
        checks.append(_host_work(rng))  # the host's CUDA is untouched
        faults = [d for d in engine.diagnostics() if d.code == "gpu-fault"]
        result.named = len(faults) == 1 and faults[0].block_id == bad.id and "'bad'" in faults[0].message
        # Runs again: the new child builds without 'bad' (its output reads zeros: 0 * 3 + 1).
        while time.perf_counter() - t0 < result.noticed_s + PHASE_DEADLINE_S:
            engine.update()
            try:
                out = engine.output(after, "Out")
            except Exception:  # the new child has not published its outputs yet
                time.sleep(0.001)
                continue
            engine.synchronize()
            if np.allclose(out.download(), 1.0):
                result.running_s = time.perf_counter() - t0
                break
        if result.running_s is None:
            result.error = f"no correct frame within {PHASE_DEADLINE_S:.0f} s of the restart"
        checks.append(_host_work(rng))
        result.host_ok = _all_ok(checks)
        return result
    finally:
        engine.close()


#: The steps of a fault in an isolated engine, each from the stamp before it (``fault_times``; the
#: first from the Hot edit): the fault surfacing in the child, the replay naming the block, the
#: replay's own steps (request read, kernels loaded, graph realized, launched block by block), the
#: child's context reset (refused on this driver), the report sent, read by the host, the faulted
#: child let go (its exit is reaped in the background) and the next child started.
STEPS = (
    "surfaced",
    "replay_read",
    "replay_kernels",
    "replay_built",
    "replay_faulted",
    "named",
    "reset",
    "sent",
    "received",
    "released",
    "restarted",
)


def fault_steps(edited: float, stamps: dict[str, float]) -> dict[str, float]:
    """Seconds of each step in ``STEPS`` from the monotonic stamps (the edit's first)."""
    steps, last = {}, edited
    for name in STEPS:
        if name in stamps:
            steps[name] = stamps[name] - last
            last = stamps[name]
    return steps


def _seconds(v: float | None, width: int = 9) -> str:
    return f"{v:{width}.3f}" if v is not None else "-".rjust(width)


def _summary(label: str, values: list[float | None]) -> dict[str, float]:
    got = [v for v in values if v is not None]
    if not got:
        print(f"{label:<34} none measured")
        return {}
    med, top = statistics.median(got), max(got)
    print(f"{label:<34} median {med:.3f} s, max {top:.3f} s ({len(got)} trials)")
    return {f"{label} median s": med, f"{label} max s": top}


def fault_trials(n: int, settle_s: float) -> dict[str, float]:
    """``n`` planted faults, each in a new isolated engine after ``settle_s`` seconds of frames:
    per-trial lines, then the summary (its keys led by ``settle_s``)."""
    rng = np.random.default_rng()
    start = time.perf_counter()
    when = f"after {settle_s:g} s of 60 fps frames" if settle_s else "in its first frames"
    print(f"\n{n} planted illegal-address faults, each in a new isolated engine {when}")
    print("(times from the Hot edit that plants the fault)")
    print(f"{'trial':>5} {'noticed s':>9} {'running s':>9} {'again s':>8} {'named':>6} {'host CuPy':>9}  note")
    trials: list[FaultTrial] = []
    for i in range(n):
        try:
            t = fault_trial(rng, settle_s)
        except Exception as exc:  # reported with the others: the host process lives on to say so
            t = FaultTrial(error=f"{type(exc).__name__}: {exc}")
        trials.append(t)
        again = t.running_s - t.noticed_s if t.running_s is not None and t.noticed_s is not None else None
        host = {True: "right", False: "WRONG", None: "-"}[t.host_ok]
        print(
            f"{i + 1:5d} {_seconds(t.noticed_s)} {_seconds(t.running_s)} {_seconds(again, 8)} "
            f"{'yes' if t.named else 'NO':>6} {host:>9}  {t.error}"
        )
    results = _summary("fault to noticed", [t.noticed_s for t in trials])
    results |= _summary(
        "noticed to running again",
        [t.running_s - t.noticed_s if t.running_s is not None and t.noticed_s is not None else None for t in trials],
    )
    results |= _summary("fault to running again", [t.running_s for t in trials])
    print("the steps to noticed (medians; each from the step before, the first from the edit):")
    for name in STEPS:
        got = [t.steps[name] for t in trials if name in t.steps]
        if got:
            med = statistics.median(got)
            print(f"  {name:<10} {med * 1e3:8.1f} ms (max {max(got) * 1e3:.1f})")
            results[f"step {name} median s"] = med
    within = sum(t.within_target for t in trials)
    named = sum(t.named for t in trials)
    print(f"ran again within {TARGET_S:.0f} s of the fault: {within}/{n} (target {n}/{n})")
    print(f"faulting block named: {named}/{n}")
    if not HAVE_CUPY:
        print("host CuPy work: not checked (CuPy is not installed)")
    else:
        right = sum(t.host_ok is True for t in trials)
        print(f"host CuPy work right before, after the fault and after the restart: {right}/{n}")
        results["host CuPy right"] = right
    print(f"host process survived: {n}/{n} trials (this line is printed by it after the last)")
    print(f"fault part: {time.perf_counter() - start:.1f} s")
    results |= {"trials": n, "ran again within 1 s": within, "named": named}
    return {f"settle {settle_s:g} s: {k}": v for k, v in results.items()}


_CONTEXT_PEER = """
import time
t0 = time.perf_counter()
from cuda.bindings import driver as d
t1 = time.perf_counter()
assert d.cuInit(0)[0] == 0
err, dev = d.cuDeviceGet(0)
err, ctx = d.cuDevicePrimaryCtxRetain(dev)
assert err == 0 and d.cuCtxSetCurrent(ctx)[0] == 0
err, ptr = d.cuMemAlloc(1 << 20)
assert err == 0 and d.cuCtxSynchronize()[0] == 0
print(t1 - t0, time.perf_counter() - t1)
"""


def context_peer(repeats: int = 5) -> dict[str, float]:
    """The floor of naming a faulting block by replay, on this machine right after the faults: a new
    process's CUDA context (``cuInit``, the primary context, an allocation and a synchronize), timed
    inside the process, and the process from start to exit (the interpreter and the import too)."""
    inside, whole = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", _CONTEXT_PEER], capture_output=True, text=True, check=True)
        whole.append(time.perf_counter() - t)
        inside.append(float(out.stdout.split()[1]))
    med_in, med_whole = statistics.median(inside), statistics.median(whole)
    print(
        f"peer: a new process's CUDA context (init, primary context, alloc, synchronize) median {med_in:.3f} s"
        f" (max {max(inside):.3f}); the process start to exit median {med_whole:.3f} s ({repeats} runs)"
    )
    return {"peer new context median s": med_in, "peer new process median s": med_whole}


_FAULT_PEER = r'''
import os, sys, time
from cuda.bindings import driver as d
PTX = b"""
.version 7.0
.target sm_75
.address_size 64
.visible .entry bad()
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    mov.u64 %rd1, 8;
    mov.u32 %r1, 1;
    st.volatile.global.u32 [%rd1], %r1;
    ret;
}
\0"""
assert d.cuInit(0)[0] == 0
err, dev = d.cuDeviceGet(0)
err, ctx = d.cuDevicePrimaryCtxRetain(dev)
assert err == 0 and d.cuCtxSetCurrent(ctx)[0] == 0
err, mod = d.cuModuleLoadData(PTX)
assert err == 0, err
err, fn = d.cuModuleGetFunction(mod, b"bad")
assert err == 0 and d.cuCtxSynchronize()[0] == 0
t0 = time.monotonic()
assert d.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0)[0] == 0
err = d.cuCtxSynchronize()[0]
t1 = time.monotonic()
print(int(err), t1 - t0, t1, flush=True)
os._exit(3)
'''


def fault_peer(repeats: int = 5) -> dict[str, float]:
    """The driver's part of a fault, bare: a process launches a kernel that stores to an illegal
    address; timed from the launch to the error its synchronize returns, and from that error to the
    process's exit as its parent sees it (the driver tears the faulted context down meanwhile)."""
    to_error, to_exit = [], []
    for _ in range(repeats):
        with subprocess.Popen([sys.executable, "-c", _FAULT_PEER], stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            line = proc.stdout.readline().split()
            proc.wait()
            gone = time.monotonic()
        if len(line) != 3 or line[0] == "0":
            print(f"peer: the planted fault did not fault ({line})")
            return {}
        to_error.append(float(line[1]))
        to_exit.append(gone - float(line[2]))
    err_med, exit_med = statistics.median(to_error), statistics.median(to_exit)
    print(
        f"peer: a bare illegal-address launch to its error median {err_med * 1e3:.1f} ms, the error to the"
        f" process's exit median {exit_med * 1e3:.1f} ms (max {max(to_exit) * 1e3:.1f}; {repeats} runs)"
    )
    return {"peer fault to error median s": err_med, "peer error to exit median s": exit_med}


def main() -> None:
    ap = argparse.ArgumentParser(description="Isolated engine overhead, and planted faults: how soon it runs again.")
    ap.add_argument("--trials", type=int, default=20, help="planted faults, each in a new isolated engine")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of frames before each of those faults")
    ap.add_argument(
        "--start-trials", type=int, default=10, help="then faults in a new engine's first frames (its replay "
        "process may still be starting: a fault soon after the start waits for it)"
    )  # fmt: skip
    ap.add_argument("--no-fault", action="store_true", help="the overhead part only")
    args = ap.parse_args()
    results: dict[str, float] = {}
    with Engine(wait_for_compile=True) as normal:
        s = chain(normal)
        g = normal.graph
        assert g is not None
        d, exe, stream = driver(), g.handle, normal.device.stream
        results["cuGraphLaunch"] = host_us(
            lambda: check(d.cuGraphLaunch(exe, stream)), 3000, normal.synchronize, every=100
        )
        results["normal update"] = host_us(normal.update, 3000, normal.synchronize, every=100)
        results["normal hot update"] = host_us(hot(normal, s), 3000, normal.synchronize, every=100)
    with Engine(isolated=True, wait_for_compile=True) as iso:
        s = chain(iso)
        results["isolated update"] = host_us(iso.update, 3000, iso.synchronize, every=100)
        results["isolated hot update"] = host_us(hot(iso, s), 3000, iso.synchronize, every=100)
    base = results["normal update"]
    print(f"{'what':<22} {'host us':>9} {'vs normal update':>17}")
    for k, v in results.items():
        print(f"{k:<22} {v:9.2f} {v / base:16.2f}x")
    if not args.no_fault:
        results |= fault_trials(args.trials, args.settle)
        if args.start_trials:
            results |= fault_trials(args.start_trials, 0.0)
        results |= context_peer()
        results |= fault_peer()
    write_results("isolated.json", results, indent=2)


if __name__ == "__main__":
    main()
