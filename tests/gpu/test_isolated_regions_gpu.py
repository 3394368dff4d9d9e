"""Regions, FrameDelay and composites through the isolated engine on a real GPU: the Jacobi While and a
For with a FrameDelay give bit for bit what an in-process engine gives (and NumPy), iterations and the
``region-max`` warning come back from the engine process, ``place`` moves a block into a body and out,
a delay's alternating output is the frame's, composites (flattened and child graph) run as in process,
Upload/Download rings are shared with the engine process, and (marked ``gpu_fault``, run last) a fault
inside a For body ends only the engine process."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cudapatch import Composite, CustomKernel, Engine, Fill, For, FrameDelay, If, KernelFile, Scale, While

from .conftest import ABOVE, ADD

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = Path(__file__).with_name("isolated_fault_scenario.py")
A, B = 0.5, 0.25  # x * 0.5 is exact, so x*a+b rounds once with or without FMA: NumPy matches bit for bit


def _engines():
    """An in-process engine and an isolated one, both waiting for compiles and builds."""
    return Engine(wait_for_compile=True), Engine(isolated=True, wait_for_compile=True)


def _jacobi_module():
    spec = importlib.util.spec_from_file_location("jacobi_example", ROOT / "examples" / "08_jacobi.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def _jacobi(e: Engine, nx: int, h2: float, tol: float, max_iter: int):
    n = nx * nx
    zero = e.add(Fill(name="Zero", Count=n, Value=0.0))
    src = e.add(Fill(name="Source", Count=n, Value=1.0))
    solve = e.add(While(name="Solve", Max=max_iter))
    kernels = ROOT / "examples" / "jacobi"
    sa = e.add(KernelFile(kernels / "jacobi_a.cu", name="SweepA", h2=h2, nx=nx), region=solve)
    sb = e.add(KernelFile(kernels / "jacobi_b.cu", name="SweepB", h2=h2, nx=nx), region=solve)
    d = e.add(KernelFile(kernels / "decide.cu", name="Decide", tol=tol), region=solve)
    for s, sp, t, tp in (
        (zero, "Out", sa, "u"), (zero, "Out", sb, "u"), (src, "Out", sa, "f"), (src, "Out", sb, "f"),
        (sa, "half", sb, "half"), (sb, "u", d, "u"), (sa, "half", d, "half"), (d, "more", solve, "Condition"),
    ):  # fmt: skip
        e.connect(s, sp, t, tp)
    return solve, sb, d


def test_the_jacobi_while_gives_the_same_solve_isolated_and_in_process() -> None:
    mod = _jacobi_module()
    nx = 32
    n, h2 = nx * nx, (1.0 / (nx - 1)) ** 2
    f = np.ones(n, np.float32)
    normal, iso = _engines()
    with normal, iso:
        got = {}
        for name, e in (("normal", normal), ("isolated", iso)):
            solve, sb, d = _jacobi(e, nx, h2, 1e-6, 20000)
            e.wait_ready()
            e.update()
            u1, its1 = e.read(sb, "u"), e.iterations(solve)
            e.show_frame()
            quiet = not [x for x in e.diagnostics(solve) if x.code == "region-max"]
            rebuilds = e.counters.rebuilds
            d.set("tol", 1e-5)  # Hot, a block inside the body: no rebuild in either
            e.update()
            u2, its2 = e.read(sb, "u"), e.iterations(solve)
            assert e.counters.rebuilds == rebuilds, name
            solve.set("Max", 5)  # Hot: the guard stops it, and the stats say so
            e.update()
            u3, its3 = e.read(sb, "u"), e.iterations(solve)
            e.show_frame()
            warned = any(x.code == "region-max" for x in e.diagnostics(solve))
            got[name] = (u1, its1, u2, its2, u3, its3, quiet, warned, str(solve))
        (u1, its1, u2, its2, u3, its3, quiet, warned, tip) = got["isolated"]
        for a, b in zip(got["normal"][:6], got["isolated"][:6], strict=True):
            np.testing.assert_array_equal(a, b)
        ref1, ref_its1 = mod.jacobi_numpy(nx, f, h2, float(np.float32(1e-6)), 20000)
        ref2, ref_its2 = mod.jacobi_numpy(nx, f, h2, float(np.float32(1e-5)), 20000)
        assert (its1, its2, its3) == (ref_its1, ref_its2, 5) and its2 < its1
        np.testing.assert_array_equal(u1, ref1)
        np.testing.assert_array_equal(u2, ref2)
        assert quiet and warned and got["normal"][6:8] == (True, True)
        assert "Iterations: 5/5" in tip and "Iterations: 5/5" in got["normal"][8]


def _steps(x: np.ndarray, n: int) -> np.ndarray:
    for _ in range(n):
        x = x * np.float32(A) + np.float32(B)
    return x


@pytest.mark.parametrize("unroll", [1, None], ids=["unroll1-copy", "default-pingpong"])
def test_a_for_with_a_frame_delay_gives_the_same_frames_isolated_and_in_process(
    rng: np.random.Generator, unroll: int | None
) -> None:
    n = 50_000
    x0 = (rng.standard_normal(n) * 100).astype(np.float32)
    normal, iso = _engines()
    with normal, iso:
        seen: dict[str, list] = {}
        for name, e in (("normal", normal), ("isolated", iso)):
            loop = e.add(For(name="Steps", Count=7, **({} if unroll is None else {"Unroll": unroll})))
            delay = e.add(FrameDelay(name="delay"), region=loop)
            step = e.add(Scale(name="step", Factor=A, Offset=B), region=loop)
            e.bind(delay, "Init", x0)
            e.connect(delay, "Out", step, "In")
            e.connect(step, "Out", delay, "In")
            out = seen[name] = []
            for count in (7, 7, 4, 13):
                loop.set("Count", count)  # Hot
                e.update()
                out.append((e.read(step, "Out"), e.read(delay, "Out"), e.iterations(loop)))
            delay.reset()  # Hot: the start value again before the next frame's loop
            e.update()
            out.append((e.read(step, "Out"), e.read(delay, "Out"), e.iterations(loop)))
        state, want = x0, []
        for count in (7, 7, 4, 13):
            state = _steps(state, count)
            want.append((state, count))
        want.append((_steps(x0, 13), 13))
        for (ns, nd, ni), (i_s, i_d, ii), (w, wi) in zip(seen["normal"], seen["isolated"], want, strict=True):
            np.testing.assert_array_equal(i_s, ns)
            np.testing.assert_array_equal(i_d, nd)
            np.testing.assert_array_equal(i_d, w)
            assert ii == ni == wi


def test_place_moves_a_block_into_a_body_and_out_isolated_as_in_process() -> None:
    normal, iso = _engines()
    with normal, iso:
        got = {}
        for name, e in (("normal", normal), ("isolated", iso)):
            start = e.add(Fill(name="Start", Count=1000, Value=1.0))
            loop = e.add(For(name="Loop", Count=5))
            e.add(Fill(name="Other", Count=16, Value=2.0), region=loop)  # the body is not empty meanwhile
            add = e.add(CustomKernel(name="Add", Code=ADD, step=0.5))
            e.connect(start, "Out", add, "x")
            e.update()
            top = e.read(add, "x")
            e.place(add, loop)  # into the For: a structure edit
            e.update()
            inside = e.read(add, "x")
            its = e.iterations(loop)
            e.place(add, None)
            e.update()
            got[name] = (top, inside, its, e.read(add, "x"))
        for a, b in zip(got["normal"], got["isolated"], strict=True):
            np.testing.assert_array_equal(a, b)
        top, inside, its, back = got["isolated"]
        assert np.all(top == 1.5) and np.all(inside == 1.0 + 5 * 0.5) and its == 5 and np.all(back == 1.5)


def test_an_if_runs_its_body_only_when_its_condition_holds_isolated() -> None:
    with Engine(isolated=True, wait_for_compile=True) as iso:
        level = iso.add(Fill(name="Level", Count=16, Value=5.0))
        check = iso.add(CustomKernel(name="Check", Code=ABOVE, level=1.0))
        maybe = iso.add(If(name="Maybe"))
        body = iso.add(Scale(name="Body", Factor=3.0), region=maybe)
        iso.connect(level, "Out", check, "in")
        iso.connect(check, "more", maybe, "Condition")
        iso.connect(level, "Out", body, "In")
        iso.update()
        np.testing.assert_array_equal(iso.read(body, "Out"), np.full(16, 15.0, np.float32))
        assert iso.iterations(maybe) is None  # an If counts nothing
        level.set("Value", 7.0)
        check.set("level", 10.0)  # Hot: 7 > 10 is false, the body is skipped: Out keeps 15
        iso.update()
        np.testing.assert_array_equal(iso.read(body, "Out"), np.full(16, 15.0, np.float32))
        check.set("level", 1.0)
        iso.update()
        np.testing.assert_array_equal(iso.read(body, "Out"), np.full(16, 21.0, np.float32))


def test_a_loops_time_and_iterations_reach_the_host_blocks_and_outputs_keep_their_shape() -> None:
    import cupy as cp

    with Engine(isolated=True, wait_for_compile=True) as iso:
        start = iso.add(Fill(name="Start", Count=1 << 20, Value=1.0))
        loop = iso.add(For(name="Loop", Count=50))
        add = iso.add(CustomKernel(name="Add", Code=ADD, step=0.5), region=loop)
        iso.connect(start, "Out", add, "x")
        img = iso.add(Scale(name="Img", Factor=2.0))
        iso.bind(img, "In", np.ones((48, 64), np.float32))
        iso.set_profiling("PerBlock")
        for _ in range(4):
            iso.update()
        iso.synchronize()
        stats = iso.show_frame()
        assert loop.debug.gpu_ms is not None and loop.debug.gpu_ms > 0
        assert "Iterations: 50/50" in str(loop)
        assert stats.gpu_ms is not None and loop.debug.gpu_ms <= stats.gpu_ms
        row = next(r for r in stats.blocks if r.block_id == add.id)  # timed inside the body, per iteration
        assert row.runs == 50 and row.gpu_ms is not None and "Per iteration" in str(add)
        assert iso.output_shape(img, "Out").dims == (48, 64)
        assert iso.output_shape(add, "x").dims == (1 << 20,)
        assert str(add.port("x")).endswith(f"{4 << 20:,} bytes")
        out = cp.asarray(iso.output(add, "x"))  # the engine process's buffer, mapped: no copy
        iso.synchronize()
        assert float(out[0].get()) == 1.0 + 50 * 0.5


def test_a_top_level_delays_output_is_the_frames_buffer_in_the_isolated_engine(rng: np.random.Generator) -> None:
    """Without regions a delay's two buffers swap every frame (two executables): output() hands out the
    buffer the frame sent last wrote, as an in-process engine does, so a view taken each frame is current."""
    import cupy as cp

    n = 4096
    x0 = (rng.standard_normal(n) * 10).astype(np.float32)
    with Engine(isolated=True, wait_for_compile=True) as iso:
        delay = iso.add(FrameDelay(name="delay"))
        step = iso.add(Scale(name="step", Factor=A, Offset=B))
        iso.bind(delay, "Init", x0)
        iso.connect(delay, "Out", step, "In")
        iso.connect(step, "Out", delay, "In")
        iso.keep(step, "Out")
        iso.wait_ready()
        state = x0
        for frame in range(1, 7):
            iso.update()
            state = _steps(state, 1)
            view = cp.asarray(iso.output(step, "Out"))
            iso.synchronize()
            np.testing.assert_array_equal(cp.asnumpy(view), state, err_msg=f"frame {frame}")
        np.testing.assert_array_equal(iso.read(step, "Out"), state)


class _Pair(Composite):
    type_name = "Pair"

    def compose(self, c) -> None:
        c.add("a", Scale(Factor=2.0))
        c.add("b", Scale(Offset=0.5))
        c.link("a.Out", "b.In")
        c.expose("In", "a.In")
        c.expose("Out", "b.Out")
        c.expose("Gain", "a.Factor", "b.Factor")


@pytest.mark.parametrize("child_graph", [False, True], ids=["flattened", "child-graph"])
def test_a_composite_runs_isolated_as_in_process(rng: np.random.Generator, child_graph: bool) -> None:
    x = rng.standard_normal(10_000).astype(np.float32)
    normal, iso = _engines()
    with normal, iso:
        got = {}
        for name, e in (("normal", normal), ("isolated", iso)):
            pair = e.add(_Pair(name="pair", Gain=1.5, child_graph=child_graph))
            loop = e.add(For(name="Loop", Count=3))
            inner = e.add(_Pair(name="inner", Gain=0.5), region=loop)
            e.bind(pair, "In", x)
            e.connect(pair, "Out", inner, "In")
            e.set_profiling("PerBlock")
            e.update()
            first = e.read(inner, "Out")
            rebuilds = e.counters.rebuilds
            pair.set("Gain", 3.0)  # Hot: an exposed parameter
            e.update()
            second = e.read(pair, "Out")
            assert e.counters.rebuilds == rebuilds, name
            for _ in range(3):
                e.update()
            e.synchronize()
            e.show_frame()
            got[name] = (first, second, pair.debug.gpu_ms is not None, str(pair).split(":")[1].split(",")[0])
        for a, b in zip(got["normal"], got["isolated"], strict=True):
            np.testing.assert_array_equal(a, b)
        # Gain sets both Factors; only b has an Offset: (3x + 0) * 3 + 0.5
        np.testing.assert_allclose(got["isolated"][1], (x.astype(np.float64) * 3.0) * 3.0 + 0.5, rtol=1e-5, atol=1e-6)
        # the composite's own GPU time (or its absence) and its state are the in-process engine's


def test_upload_and_download_rings_work_through_the_isolated_engine(rng: np.random.Generator) -> None:
    """The rings live in pages both processes map (``share_host_memory``): the host writes an upload
    and reads a download with plain stores and loads, the engine process's kernels copy them."""
    from cudapatch import Download, Upload
    from cudapatch.engine.transfer import DownloadRing, UploadRing

    n = 4096
    with Engine(isolated=True, wait_for_compile=True) as iso:
        up = iso.add(Upload(name="up", Count=n))
        double = iso.add(Scale(name="double", Factor=2.0))
        tap = iso.add(Download(name="tap"))
        iso.connect(up, "Out", double, "In")
        iso.connect(double, "Out", tap, "In")
        with UploadRing(iso, up) as feed, DownloadRing(iso, tap, n) as ring:
            iso.update()
            iso.synchronize()
            frames = []
            for _ in range(30):
                feed.write(rng.standard_normal(n).astype(np.float32))  # never waits
                iso.update()
                got = ring.read()  # plain loads, a frame or two old
                if got is not None:
                    frames.append(got[1])
            iso.synchronize()
            assert frames == sorted(frames) and feed.written + feed.dropped == 30
            last = rng.standard_normal(n).astype(np.float32)
            assert feed.write(last)  # the engine process is idle: the slot is free
            iso.update()
            iso.synchronize()
            values, frame = ring.read()
            np.testing.assert_array_equal(values, last * np.float32(2.0))
            np.testing.assert_array_equal(iso.read(up, "Out"), last)
            assert frame > (frames[-1] if frames else 0)


@pytest.mark.gpu_fault
def test_a_fault_inside_a_for_body_ends_only_the_engine_process() -> None:
    out = subprocess.run(
        [sys.executable, str(SCENARIO), "3", "--in-for"], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert out.returncode == 0 and out.stdout.strip().startswith("OK"), out.stdout + out.stderr[-4000:]
    assert len(out.stdout.split()[1:]) == 3
