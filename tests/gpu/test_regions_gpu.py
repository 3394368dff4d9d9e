"""Regions on a real GPU: For/While/If as conditional nodes against NumPy, Hot/Warm/Code edits of
blocks inside bodies without a rebuild, Hot Count and Max, nested regions, iteration counts through
the readback ring, the Max warning, a region's time in the profile, and the Jacobi example's solve."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from cudapatch import CustomKernel, Engine, Fill, For, GpuBuffer, If, KernelFile, Scale, While
from cudapatch.errors import ParameterError

from .conftest import ABOVE, ADD, halving_while

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

ADD_TWICE = """extern "C" __global__ void add(/*inout*/ float* x, float step, unsigned int n)
{ unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 2.0f * step; }"""


def _for_patch(engine: Engine, count: int, n: int = 1000) -> tuple[Fill, For, CustomKernel]:
    start = engine.add(Fill(name="Start", Count=n, Value=1.0))
    loop = engine.add(For(name="Loop", Count=count))
    add = engine.add(CustomKernel(name="Add", Code=ADD, step=0.5), region=loop)
    engine.connect(start, "Out", add, "x")
    return start, loop, add


def _frame(engine: Engine, block, port: str) -> np.ndarray:
    engine.update()
    return engine.read(block, port)


def _check_a_warm_rebind_in(engine: Engine, loop, rng: np.random.Generator) -> None:
    """A Scale in ``loop``'s body reads a bound input; a Warm rebind to another pointer of the same size
    reaches it (every copy, if the body is unrolled) without a rebuild. The Scale is removed after."""
    scale = engine.add(Scale(name="S", Factor=2.0), region=loop)
    a, b = rng.standard_normal(512).astype(np.float32), rng.standard_normal(512).astype(np.float32)
    engine.bind(scale, "In", a)
    np.testing.assert_allclose(_frame(engine, scale, "Out"), a * 2.0, rtol=1e-6)
    graph = engine.graph
    other = GpuBuffer(engine.pool, scale.description.input("In").dtype, 512, stream=engine.stream)
    try:
        other.upload(b)
        engine.bind(scale, "In", other)  # Warm: another pointer of the same size, patched into the body
        np.testing.assert_allclose(_frame(engine, scale, "Out"), b * 2.0, rtol=1e-6)
        assert engine.graph is graph
    finally:
        engine.remove(scale)
        engine.update()
        engine.synchronize()
        other.close()


def test_a_for_runs_its_body_count_times_and_count_is_hot(engine: Engine) -> None:
    _, loop, add = _for_patch(engine, 7)
    np.testing.assert_array_equal(_frame(engine, add, "x"), np.full(1000, 1.0 + 7 * 0.5, np.float32))
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    for count in (0, 1, 40):
        loop.set("Count", count)  # Hot: both set-condition kernels' slots, no rebuild
        np.testing.assert_array_equal(_frame(engine, add, "x"), np.full(1000, 1.0 + count * 0.5, np.float32))
        assert engine.iterations(loop) == count
    assert engine.graph is graph and graph.instantiations == 1 and engine.counters.rebuilds == rebuilds


def test_hot_warm_and_code_edits_inside_a_body_need_no_rebuild(engine: Engine) -> None:
    start, loop, add = _for_patch(engine, 4)
    _frame(engine, add, "x")
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    add.set("step", 0.25)  # Hot, a kernel inside the body
    np.testing.assert_array_equal(_frame(engine, add, "x"), np.full(1000, 2.0, np.float32))
    start.set("Value", 3.0)  # Hot, before the region
    np.testing.assert_array_equal(_frame(engine, add, "x"), np.full(1000, 4.0, np.float32))
    swaps = engine.counters.code_swaps
    add.set("Code", ADD_TWICE)  # Code tier: the same signature, swapped into the body's node
    engine.wait_ready()
    np.testing.assert_array_equal(_frame(engine, add, "x"), np.full(1000, 5.0, np.float32))
    assert engine.counters.code_swaps == swaps + 1
    assert engine.graph is graph and engine.counters.rebuilds == rebuilds


def test_a_warm_rebind_reaches_a_kernel_inside_a_body(engine: Engine, rng: np.random.Generator) -> None:
    _check_a_warm_rebind_in(engine, engine.add(For(name="Loop", Count=3)), rng)


def test_a_while_stops_when_its_condition_turns_false_and_warns_at_max(engine: Engine) -> None:
    start = engine.add(Fill(name="Start", Count=256, Value=1024.0))
    solve, halve, check = halving_while(engine, start)
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.ones(256, np.float32))  # 1024 / 2**10
    assert engine.iterations(solve) == 10
    rebuilds = engine.counters.rebuilds
    engine.show_frame()
    assert not [d for d in engine.diagnostics(solve) if d.code == "region-max"]
    solve.set("Max", 4)  # Hot: the guard stops it early, and says so
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.full(256, 64.0, np.float32))
    assert engine.iterations(solve) == 4
    engine.show_frame()
    assert any(d.code == "region-max" for d in engine.diagnostics(solve))
    check.set("level", 100.0)  # Hot, inside the body: the condition turns false sooner
    solve.set("Max", 100)
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.full(256, 64.0, np.float32))
    assert engine.iterations(solve) == 4 and engine.counters.rebuilds == rebuilds


def test_a_hot_max_of_0_on_a_running_while_is_refused_and_the_loop_runs_on(engine: Engine) -> None:
    """Max 0 would skip the body silently in the running graph (the build's check does not see Hot
    edits): ``set`` refuses it, and the next frames run the loop with the old Max, no rebuild."""
    start = engine.add(Fill(name="Start", Count=256, Value=1024.0))
    solve, halve, _ = halving_while(engine, start)
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.ones(256, np.float32))
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    with pytest.raises(ParameterError) as ei:
        solve.set("Max", 0)
    assert (ei.value.block, ei.value.param) == ("Halving", "Max") and solve.get("Max") == 100
    for _ in range(3):
        np.testing.assert_array_equal(_frame(engine, halve, "x"), np.ones(256, np.float32))
        assert engine.iterations(solve) == 10
    assert engine.graph is graph and engine.counters.rebuilds == rebuilds
    assert not [d for d in engine.diagnostics() if d.severity == "error"]


def test_bad_region_edits_are_errors_on_the_region_and_the_last_graph_runs_on(engine: Engine) -> None:
    """A While whose condition block leaves its body, then a cycle through the region: each an error
    naming the region (and the blocks of the loop), and the running graph goes on halving every frame
    until the patch is mended, which builds again."""
    start = engine.add(Fill(name="Start", Count=256, Value=1024.0))
    solve, halve, check = halving_while(engine, start)
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.ones(256, np.float32))
    graph = engine.graph

    def runs_on() -> None:
        for _ in range(3):
            np.testing.assert_array_equal(_frame(engine, halve, "x"), np.ones(256, np.float32))
            assert engine.iterations(solve) == 10 and engine.graph is graph

    engine.place(check, None)  # the condition's block leaves the body
    engine.wait_ready()
    runs_on()
    errors = [d for d in engine.diagnostics() if d.severity == "error"]
    assert any(d.block_id == solve.id and d.code == "region-condition" and "'Check'" in d.message for d in errors)
    engine.place(check, solve)  # mended: builds again, and the loop runs in the new graph
    engine.wait_ready()
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.ones(256, np.float32))
    assert not [d for d in engine.diagnostics() if d.severity == "error"]
    graph = engine.graph

    after = engine.add(Scale(name="After", Factor=1.0))  # at the top level: it runs after the region
    engine.connect(halve, "x", after, "In")
    engine.connect(after, "Out", check, "in")  # ... and the condition inside would read it: a cycle
    engine.wait_ready()
    runs_on()
    errors = [d for d in engine.diagnostics() if d.severity == "error" and d.code == "cycle"]
    assert {d.block_id for d in errors} >= {solve.id, after.id}, errors
    engine.remove(after)
    engine.connect(halve, "x", check, "in")
    engine.wait_ready()
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.ones(256, np.float32))
    assert not [d for d in engine.diagnostics() if d.severity == "error"]


def test_an_if_runs_its_body_only_when_its_condition_holds(engine: Engine) -> None:
    level = engine.add(Fill(name="Level", Count=16, Value=5.0))
    check = engine.add(CustomKernel(name="Check", Code=ABOVE, level=1.0))
    maybe = engine.add(If(name="Maybe"))
    body = engine.add(Scale(name="Body", Factor=3.0), region=maybe)
    engine.connect(level, "Out", check, "in")
    engine.connect(check, "more", maybe, "Condition")
    engine.connect(level, "Out", body, "In")
    np.testing.assert_array_equal(_frame(engine, body, "Out"), np.full(16, 15.0, np.float32))
    rebuilds = engine.counters.rebuilds
    engine.output(body, "Out").fill_bytes(0xFF)  # poison: an If that does not run leaves it alone
    check.set("level", 10.0)  # Hot: 5 > 10 is false, the body is skipped on the GPU
    out = _frame(engine, body, "Out")
    assert np.isnan(out).all()
    check.set("level", 1.0)
    np.testing.assert_array_equal(_frame(engine, body, "Out"), np.full(16, 15.0, np.float32))
    assert engine.counters.rebuilds == rebuilds


def test_regions_nest(engine: Engine) -> None:
    start = engine.add(Fill(name="Start", Count=300, Value=0.0))
    outer = engine.add(For(name="Outer", Count=3))
    inner = engine.add(For(name="Inner", Count=4), region=outer)
    a = engine.add(CustomKernel(name="A", Code=ADD, step=1.0), region=inner)
    b = engine.add(CustomKernel(name="B", Code=ADD, step=100.0), region=outer)
    engine.connect(start, "Out", a, "x")
    engine.connect(a, "x", b, "x")
    np.testing.assert_array_equal(_frame(engine, b, "x"), np.full(300, 3 * (4 * 1.0 + 100.0), np.float32))
    assert (engine.iterations(outer), engine.iterations(inner)) == (3, 4)  # the inner count restarts each time
    inner.set("Count", 2)
    np.testing.assert_array_equal(_frame(engine, b, "x"), np.full(300, 3 * (2 * 1.0 + 100.0), np.float32))


def test_profiling_shows_a_regions_time(engine: Engine) -> None:
    _, loop, add = _for_patch(engine, 50, n=1 << 20)
    engine.set_profiling("PerBlock")
    for _ in range(4):
        engine.update()
    engine.synchronize()
    stats = engine.show_frame()
    assert loop.debug.gpu_ms is not None and loop.debug.gpu_ms > 0
    assert "Iterations: 50/50" in str(loop)
    assert stats.gpu_ms is not None and loop.debug.gpu_ms <= stats.gpu_ms


def test_the_jacobi_example_solve_matches_numpy_bit_for_bit() -> None:
    spec = importlib.util.spec_from_file_location("jacobi_example", ROOT / "examples" / "08_jacobi.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    assert mod.main(["--headless", "--frames", "6", "--size", "48"]) == 0


@pytest.mark.gl  # the standalone host renders (EGL) even when headless
def test_the_jacobi_patch_runs_in_the_standalone_host(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-m", "cudapatch", "run", str(ROOT / "examples" / "08_jacobi.toml"), "--headless"]
        + ["--frames", "5", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr


def test_a_kernel_file_body_reads_the_while_condition_from_the_example_kernels(engine: Engine) -> None:
    nx = 16
    n = nx * nx
    zero = engine.add(Fill(name="Zero", Count=n, Value=0.0))
    src = engine.add(Fill(name="Source", Count=n, Value=1.0))
    solve = engine.add(While(name="Solve", Max=3))
    kernels = ROOT / "examples" / "jacobi"
    sa = engine.add(KernelFile(kernels / "jacobi_a.cu", name="A", h2=0.01, nx=nx), region=solve)
    sb = engine.add(KernelFile(kernels / "jacobi_b.cu", name="B", h2=0.01, nx=nx), region=solve)
    d = engine.add(KernelFile(kernels / "decide.cu", name="D", tol=0.0), region=solve)
    for s, sp, t, tp in (
        (zero, "Out", sa, "u"), (zero, "Out", sb, "u"), (src, "Out", sa, "f"), (src, "Out", sb, "f"),
        (sa, "half", sb, "half"), (sb, "u", d, "u"), (sa, "half", d, "half"), (d, "more", solve, "Condition"),
    ):  # fmt: skip
        engine.connect(s, sp, t, tp)
    _frame(engine, sb, "u")
    assert engine.iterations(solve) == 3  # tol 0 never converges in 3: Max stops it


def test_the_driver_patches_nodes_inside_a_body_directly(engine: Engine) -> None:
    """A finding, not a requirement: whether ``cuGraphExecKernelNodeSetParams`` takes a node of a
    conditional body (if this fails, Hot edits inside bodies go through the cuGraphExecUpdate fallback,
    which the other tests check for results)."""
    _, loop, add = _for_patch(engine, 3)
    _frame(engine, add, "x")
    add.set("step", 2.0)
    np.testing.assert_array_equal(_frame(engine, add, "x"), np.full(1000, 7.0, np.float32))
    assert engine.graph._body_fallback is False


@pytest.mark.parametrize("unroll", [4, 8])
def test_an_unrolled_for_runs_exactly_count_iterations(engine: Engine, unroll: int) -> None:
    """Count // Unroll passes of the main loop, the rest in the tail: every count is exact, and Count
    stays Hot across main-only, tail-only and both."""
    start = engine.add(Fill(name="Start", Count=1000, Value=1.0))
    loop = engine.add(For(name="Loop", Count=1, Unroll=unroll))
    add = engine.add(CustomKernel(name="Add", Code=ADD, step=0.5), region=loop)
    engine.connect(start, "Out", add, "x")
    _frame(engine, add, "x")
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    for count in (0, 3, unroll, 2 * unroll, 2 * unroll + 3, 41):
        loop.set("Count", count)
        np.testing.assert_array_equal(_frame(engine, add, "x"), np.full(1000, 1.0 + count * 0.5, np.float32))
        assert engine.iterations(loop) == count
    assert engine.graph is graph and engine.counters.rebuilds == rebuilds


def test_an_unrolled_while_checks_once_per_pass_counts_what_ran_and_never_passes_max(engine: Engine) -> None:
    start = engine.add(Fill(name="Start", Count=256, Value=1024.0))
    solve, halve, check = halving_while(engine, start, unroll=4)
    # 10 halvings reach 1.0; the condition is read after each pass of 4: 12 run (1024 / 2**12)
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.full(256, 0.25, np.float32))
    assert engine.iterations(solve) == 12
    engine.show_frame()
    assert not [d for d in engine.diagnostics(solve) if d.code == "region-max"]
    rebuilds = engine.counters.rebuilds
    solve.set("Max", 6)  # one pass of 4, then the tail one at a time up to Max
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.full(256, 16.0, np.float32))
    assert engine.iterations(solve) == 6
    engine.show_frame()
    assert any(d.code == "region-max" for d in engine.diagnostics(solve))
    solve.set("Max", 3)  # below one pass: the tail alone, from the first iteration
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.full(256, 128.0, np.float32))
    assert engine.iterations(solve) == 3
    assert engine.counters.rebuilds == rebuilds


def test_hot_warm_and_code_edits_reach_every_copy_of_an_unrolled_body(engine: Engine, rng: np.random.Generator) -> None:
    start = engine.add(Fill(name="Start", Count=1000, Value=1.0))
    loop = engine.add(For(name="Loop", Count=10, Unroll=4))  # 2 passes of 4 copies, then 2 in the tail
    add = engine.add(CustomKernel(name="Add", Code=ADD, step=0.5), region=loop)
    engine.connect(start, "Out", add, "x")
    np.testing.assert_array_equal(_frame(engine, add, "x"), np.full(1000, 6.0, np.float32))
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    add.set("step", 0.25)  # Hot: five nodes (four copies and the tail's)
    np.testing.assert_array_equal(_frame(engine, add, "x"), np.full(1000, 3.5, np.float32))
    add.set("Code", ADD_TWICE)  # Code: swapped into every copy
    engine.wait_ready()
    np.testing.assert_array_equal(_frame(engine, add, "x"), np.full(1000, 6.0, np.float32))
    assert engine.graph is graph and engine.counters.rebuilds == rebuilds
    # Warm: a rebound input reaches every copy
    _check_a_warm_rebind_in(engine, engine.add(For(name="Loop2", Count=5, Unroll=3)), rng)


def test_an_unrolled_while_nested_in_an_unrolled_for_restarts_on_every_entry(engine: Engine) -> None:
    """The inner While's handle and counter are set by its begin kernel in each copy of the outer
    body (two in the outer's main body, one in its tail), so each outer iteration halves a fresh 1024:
    10 halvings reach 1.0, read after each pass of 8, so 16 run (1024 / 2**16)."""
    outer = engine.add(For(name="Outer", Count=3, Unroll=2))
    reset = engine.add(Fill(name="Reset", Count=256, Value=1024.0), region=outer)
    inner, halve, check = halving_while(engine, reset, unroll=8, region=outer)
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.full(256, 1.0 / 64.0, np.float32))
    assert (engine.iterations(outer), engine.iterations(inner)) == (3, 16)
    inner.set("Max", 12)  # Hot in all three copies: a pass of 8, then the tail stops exactly at 1.0
    np.testing.assert_array_equal(_frame(engine, halve, "x"), np.ones(256, np.float32))
    assert engine.iterations(inner) == 10


@pytest.mark.parametrize("unroll", [2, 4, 8])
def test_an_unrolled_jacobi_while_makes_decide_once_per_pass_and_matches_numpy(engine: Engine, unroll: int) -> None:
    """The example's Jacobi solve at ``Unroll`` U: ``Decide`` (read only by the condition) runs in the last
    copy of each pass; the solve stops within U - 1 iterations past NumPy's, and u is NumPy's after
    exactly the iterations run, bit for bit."""
    spec = importlib.util.spec_from_file_location("jacobi_example", ROOT / "examples" / "08_jacobi.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    nx = 32
    n, h2, tol = nx * nx, (1.0 / (nx - 1)) ** 2, 1e-6
    zero = engine.add(Fill(name="Zero", Count=n, Value=0.0))
    src = engine.add(Fill(name="Source", Count=n, Value=1.0))
    solve = engine.add(While(name="Solve", Max=20000, Unroll=unroll))
    kernels = ROOT / "examples" / "jacobi"
    sa = engine.add(KernelFile(kernels / "jacobi_a.cu", name="A", h2=h2, nx=nx), region=solve)
    sb = engine.add(KernelFile(kernels / "jacobi_b.cu", name="B", h2=h2, nx=nx), region=solve)
    d = engine.add(KernelFile(kernels / "decide.cu", name="D", tol=tol), region=solve)
    for s, sp, t, tp in (
        (zero, "Out", sa, "u"), (zero, "Out", sb, "u"), (src, "Out", sa, "f"), (src, "Out", sb, "f"),
        (sa, "half", sb, "half"), (sb, "u", d, "u"), (sa, "half", d, "half"), (d, "more", solve, "Condition"),
    ):  # fmt: skip
        engine.connect(s, sp, t, tp)
    engine.wait_ready()
    u = _frame(engine, sb, "u")
    its = engine.iterations(solve)
    plan = engine.graph.plan
    assert len(plan.block_nodes[d.id]) == 2  # the main body's last copy and the tail's
    f, t32 = np.ones(n, np.float32), float(np.float32(tol))
    _, exact = mod.jacobi_numpy(nx, f, h2, t32, 20000)
    assert exact <= its <= exact + unroll - 1 and its % unroll == 0
    ref, _ = mod.jacobi_numpy(nx, f, h2, -1.0, its)  # a negative tolerance never stops: exactly its iterations
    np.testing.assert_array_equal(u, ref)
    assert engine.read(d, "more")[0] == 0  # the last iteration said stop (the output is sized like its input)


def test_iterations_are_read_without_synchronizing(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """``engine.iterations`` reads the readback ring with plain loads: frames launched and counts read
    with every synchronizing driver call refused, a While and a For (Count Hot meanwhile) alike."""
    from .test_feedback_gpu import _refuse_synchronize

    start = engine.add(Fill(name="From", Count=256, Value=1024.0))
    solve, _, _ = halving_while(engine, start)  # 10 halvings reach 1.0
    _, loop, add = _for_patch(engine, 7, n=256)
    engine.wait_ready()
    engine.update()  # built (wait_for_compile) and launched
    engine.synchronize()
    _refuse_synchronize(monkeypatch)
    seen = []
    for frame in range(60):
        if frame == 30:
            loop.set("Count", 9)  # Hot: patched into the running graph, no wait either
        engine.update()
        seen.append((engine.iterations(solve), engine.iterations(loop)))
    monkeypatch.undo()
    engine.synchronize()
    assert {w for w, _ in seen} == {10}  # a frame or two old, but never missing once a frame completed
    assert {f for _, f in seen} <= {7, 9} and seen[0][1] == 7
    assert (engine.iterations(solve), engine.iterations(loop)) == (10, 9)  # after the wait: the last frame's
    np.testing.assert_array_equal(engine.read(add, "x"), np.full(256, 1.0 + 9 * 0.5, np.float32))
