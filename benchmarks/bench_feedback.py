#!/usr/bin/env python3
"""Feedback benchmark: host time per frame of FrameDelay loops, and of per-frame Upload/Download.

FrameDelay: patches of K loops (``delay.Out -> Scale -> delay.In``, 4096 floats each) at K = 1, 8,
32, beside the same K ``Scale`` blocks fed by ``Fill`` (no delay, the same kernel count) in the same
run: median ``update()`` µs and the difference (target: ≤ 1 µs extra at 32 delays: the two phases
cost a flip per frame, not per delay). Peer: a bare ``cuGraphLaunch`` of the patch without delays.

Upload/Download: ``Upload -> Scale -> Download`` (4096 floats) with ``UploadRing.write`` and
``DownloadRing.read`` every frame, beside ``Fill -> Scale`` without them: the host µs each part
costs a frame (no synchronize anywhere).

Usage: ``python benchmarks/bench_feedback.py [--elements 4096] [--frames 3000]``.
Writes ``feedback.json`` to ``$RESULTS_DIR`` when set.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from _timing import bare_launch_us, host_us  # noqa: E402

from cudapatch import Download, DownloadRing, Engine, Fill, FrameDelay, Scale, Upload, UploadRing  # noqa: E402


def loops(k: int, n: int, *, delays: bool, frames: int) -> tuple[float, float]:
    """(median update() µs, bare launch µs) of k loops through delays, or k Fill -> Scale chains."""
    with Engine(name=f"loops{k}", fuse=False) as e:  # a node per block on both sides (fused, Fill -> Scale is one)
        for i in range(k):
            s = e.add(Scale(name=f"s{i}", Factor=0.5))
            if delays:
                d = e.add(FrameDelay(name=f"d{i}", Count=n, Fill=1.0))
                e.connect(d, "Out", s, "In")
                e.connect(s, "Out", d, "In")
            else:
                f = e.add(Fill(name=f"f{i}", Count=n, Value=1.0))
                e.connect(f, "Out", s, "In")
        e.wait_ready()
        e.update()
        assert e.graph is not None and len(e.graph.plan.delays) == (k if delays else 0)
        return host_us(e.update, frames, e.synchronize), bare_launch_us(e, frames)


def transfer(n: int, frames: int) -> dict[str, float]:
    rng = np.random.default_rng()
    data = rng.standard_normal(n).astype(np.float32)
    out: dict[str, float] = {}
    with Engine(name="plain") as e:
        f = e.add(Fill(name="f", Count=n, Value=1.0))
        s = e.add(Scale(name="s"))
        e.connect(f, "Out", s, "In")
        e.wait_ready()
        e.update()
        out["plain"] = host_us(e.update, frames, e.synchronize)
    with Engine(name="transfer") as e:
        up = e.add(Upload(name="up", Count=n))
        s = e.add(Scale(name="s"))
        tap = e.add(Download(name="tap"))
        e.connect(up, "Out", s, "In")
        e.connect(s, "Out", tap, "In")
        with UploadRing(e, up) as feed, DownloadRing(e, tap, n) as ring:
            e.wait_ready()
            e.update()
            out["blocks"] = host_us(e.update, frames, e.synchronize)  # the Upload/Download kernels, no host transfer
            out["write"] = host_us(lambda: (feed.write(data), e.update()), frames, e.synchronize)
            out["both"] = host_us(lambda: (feed.write(data), ring.read(), e.update()), frames, e.synchronize)
            out["dropped"] = float(feed.dropped)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=4096)
    ap.add_argument("--frames", type=int, default=3000)
    args = ap.parse_args()
    n, frames = args.elements, args.frames
    results: dict[str, object] = {"elements": n, "frames": frames, "loops": {}}
    print(f"FrameDelay loops of {n} floats: median update() host µs, same run")
    print(f"{'delays':>7s} {'with':>9s} {'without':>9s} {'extra':>8s} {'bare launch':>12s}  target: extra <= 1 µs")
    for k in (1, 8, 32):
        with_us, _ = loops(k, n, delays=True, frames=frames)
        without_us, bare = loops(k, n, delays=False, frames=frames)
        extra = with_us - without_us
        results["loops"][k] = {"with_us": with_us, "without_us": without_us, "extra_us": extra, "bare_us": bare}  # type: ignore[index]
        print(f"{k:7d} {with_us:9.2f} {without_us:9.2f} {extra:+8.2f} {bare:12.2f}")
    t = transfer(n, frames)
    results["transfer"] = t
    print(f"\nUpload/Download of {n} floats: median host µs per frame, same run")
    print(f"{'Fill -> Scale, update()':42s} {t['plain']:8.2f}")
    print(f"{'Upload -> Scale -> Download, update()':42s} {t['blocks']:8.2f}   {t['blocks'] - t['plain']:+.2f}")
    print(f"{'  + UploadRing.write':42s} {t['write']:8.2f}   {t['write'] - t['blocks']:+.2f}")
    print(f"{'  + UploadRing.write + DownloadRing.read':42s} {t['both']:8.2f}   {t['both'] - t['blocks']:+.2f}")
    print(f"{'  uploads dropped (GPU behind)':42s} {int(t['dropped']):8d}")
    write_results("feedback.json", results)


if __name__ == "__main__":
    main()
