#!/usr/bin/env python3
"""Diagnostic: frames that start late during structure edits, and what overlapped them.

``bench_liveness.py`` times ``update()``; a frame whose thread wakes from its sleep while another
thread holds the interpreter starts late, which ``update()``'s own time cannot show. This probe runs
``bench_liveness``'s edit rounds (a fused chain of N ``Scale`` blocks by default) with a frame loop
that records every frame starting over 0.5 ms late and every ``update()`` over 1 ms, beside:

- a bare process that sleeps 1 ms at a time and records its own late wake-ups on the same clock
  (``perf_counter`` is ``CLOCK_MONOTONIC``): a late start it shares is the machine's;
- ``gc.callbacks``: every collection over 0.2 ms, on any thread;
- with ``--calls``, a profile hook on the engine's background threads that records every C call
  that ran over 0.2 ms of the thread's CPU with no Python inside (it slows those threads' Python).

A late start that overlaps none of them was another thread holding the interpreter in something no
C-call event shows (a deallocation cascade, an operator on a big container).

H100, fused 10,000 blocks (2026-11-28): 13-24 late starts per run, up to 2-6 ms; one of 4.3 ms came
with the bare process 4.3 ms late, the others overlapped nothing recorded (docs/findings.md).

Usage: python benchmarks/probes/probe_late_starts.py [--blocks 10000] [--unfused] [--calls]
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_liveness as live  # noqa: E402

SLEEPER = r"""
import sys, time, threading, json
late, stop = [], []
threading.Thread(target=lambda: (sys.stdin.read(), stop.append(1)), daemon=True).start()
while not stop:
    t = time.perf_counter()
    time.sleep(0.001)
    lt = time.perf_counter() - t - 0.001
    if lt > 3e-4:
        late.append((t + 0.001, lt * 1e3))
json.dump(late, open(sys.argv[1], "w"))
"""

Span = tuple[float, float, str]  # start, end (perf_counter seconds), what


def _c_call_hook(spans: list[Span]) -> object:
    started: dict[int, list] = {}

    def hook(frame, event, arg):  # noqa: ANN001, ANN202
        key = threading.get_ident()
        if event == "c_call":
            started[key] = [time.thread_time(), arg, True, frame, time.perf_counter()]
        elif event in ("c_return", "c_exception"):
            st = started.pop(key, None)
            if st is not None and st[2] and time.thread_time() - st[0] > 2e-4:
                f = st[3]
                name = getattr(st[1], "__qualname__", str(st[1]))[:30]
                where = f"{f.f_code.co_filename.split('/')[-1]}:{f.f_lineno}"
                spans.append((st[4], time.perf_counter(), f"C {threading.current_thread().name[:14]} {name} {where}"))
        elif event in ("call", "return"):
            st = started.get(key)
            if st is not None:
                st[2] = False  # Python ran inside: not one hold

    return hook


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=10_000)
    ap.add_argument("--unfused", action="store_true")
    ap.add_argument("--calls", action="store_true", help="profile the background threads' C calls")
    args = ap.parse_args()
    spans: list[Span] = []
    events: list[tuple[float, float, str, float]] = []  # start, end, "late" or "update", ms
    if args.calls:
        threading.setprofile(_c_call_hook(spans))
    gc_started: dict[int, float] = {}

    def on_gc(phase: str, info: dict) -> None:
        key = threading.get_ident()
        if phase == "start":
            gc_started[key] = time.perf_counter()
            return
        t0 = gc_started.pop(key, None)
        if t0 is not None and time.perf_counter() - t0 > 2e-4:
            spans.append((t0, time.perf_counter(), f"gc{info['generation']} {threading.current_thread().name[:14]}"))

    gc.callbacks.append(on_gc)

    live.EVENTS = events
    rounds_start: list[float] = []
    quiet_row = live.update_and_bare_launch_us

    def quiet_then_mark(e):  # noqa: ANN001, ANN202
        rounds_start.append(time.perf_counter())
        return quiet_row(e)

    live.update_and_bare_launch_us = quiet_then_mark
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "late.json"
        peer = subprocess.Popen([sys.executable, "-c", SLEEPER, str(out)], stdin=subprocess.PIPE)
        for row in live.bench_size(args.blocks, 1024, not args.unfused, 3):
            if "median" in row[0] or "quiet" in row[0]:
                print(f"{row[0]}: {row[1]:.1f} ({row[4]})"[:240])
        assert peer.stdin is not None
        peer.stdin.close()
        peer.wait()
        bare = json.loads(out.read_text())
    t0 = rounds_start[0] if rounds_start else 0.0
    bare_after = [ms for t, ms in bare if t > t0]
    print(
        f"bare process: {len(bare_after)} wake-ups over 0.3 ms late during the rounds, "
        f"{sum(ms > 1 for ms in bare_after)} over 1 ms, max {max(bare_after, default=0):.2f} ms"
    )
    spans += [(t - ms / 1e3, t + ms / 1e3, f"bare process {ms:.2f} ms late") for t, ms in bare]
    shown = [ev for ev in events if ev[0] > t0]
    print(f"frames started over 0.5 ms late or update() over 1 ms during the rounds: {len(shown)}")
    for start, end, kind, ms in shown:
        near = [s for s in spans if s[0] < end and s[1] > start - 0.002]
        said = "; ".join(f"[{(s[0] - start) * 1e3:+.2f}..{(s[1] - start) * 1e3:+.2f} ms] {s[2]}" for s in near[:5])
        print(f"{start - t0:9.4f} s  {kind} {ms:.2f} ms  {said}")
    kinds = collections.Counter(s[2].split(" ")[0] for s in spans if s[0] > t0)
    print("spans recorded during the rounds:", dict(kinds))


if __name__ == "__main__":
    main()
