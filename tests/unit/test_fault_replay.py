"""The fault replay of a patch with a loop (``engine/replay.py``), on the recording stand-in for the
driver (no GPU): the snapshot sent to the replay process keeps the blocks' regions, the replay realizes
the whole graph with the engine's own kernels (set-condition and publish; without them ``realize``
refused such a patch, so a fault inside a loop body was never named), and a faulting block inside a
``For`` body is named after running once."""

from __future__ import annotations

import os
import pickle
from typing import Any

import pytest
from cuda.bindings import driver as real

from cudapatch import CustomKernel, Fill, For, Scale
from cudapatch.engine import Context, realize
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.plan import KernelNodePlan
from cudapatch.engine.replay import _portable, engine_kernel_sources, replay_plan, replayed_nodes
from cudapatch.errors import CudapatchError

from .recording_driver import OK, RegionDriver, StubDevice, install

BAD = """
extern "C" __global__ void k(const float* in, float* out, float trigger, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + 1.0f;
    if (trigger > 0.5f && i == 0) *((volatile float*)(size_t)8) = 1.0f;
}"""
ILLEGAL = real.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS


class LaunchDriver(RegionDriver):
    """Also launches kernels alone (recorded by function): ``faulting`` functions fail with an illegal address."""

    def __init__(self, faulting: set[int]) -> None:
        super().__init__()
        self.faulting = faulting
        self.launched: list[int] = []

    def cuLaunchKernel(self, func, *args):  # noqa: N802
        self.launched.append(int(func))
        return (ILLEGAL,) if int(func) in self.faulting else (OK,)

    def cuStreamSynchronize(self, stream):  # noqa: N802
        return (OK,)

    def cuMemsetD8Async(self, *a):  # noqa: N802
        return (OK,)

    def cuGetErrorName(self, err):  # noqa: N802
        return OK, err.name.encode()

    def cuGetErrorString(self, err):  # noqa: N802
        return OK, b"an illegal memory access was encountered"


def _loop_patch(count: int = 3, unroll: int | None = None) -> tuple[Context, dict[str, Any]]:
    """The GPU scenario's patch (tests/gpu/isolated_fault_scenario.py --in-for): 'bad' in a For body."""
    c = Context()
    fill = c.register_block(Fill(name="fill", Count=4096, Value=2.0))
    loop = c.register_block(For(name="loop", Count=count, **({"Unroll": unroll} if unroll else {})))
    beside = c.register_block(Fill(name="beside", Count=64, Value=1.0))
    bad = c.register_block(CustomKernel(name="bad", Code=BAD))
    after = c.register_block(Scale(name="after", Factor=3.0, Offset=1.0))
    c.place(beside, loop)
    c.place(bad, loop)
    bad.set("trigger", 1.0)
    c.connect(fill, "Out", bad, "in")
    c.connect(bad, "out", after, "In")
    return c, {"fill": fill, "loop": loop, "beside": beside, "bad": bad, "after": after}


def _sent(c: Context) -> Any:
    """The snapshot as the replay process receives it (``attribute_in_child`` pickles it)."""
    return pickle.loads(pickle.dumps(_portable(c.snapshot())))


def _functions(snap: Any, plan: Any, engine_kernels: bool = True) -> tuple[dict, Any, Any, dict]:
    """The functions the replay process loads (``replay.main``): each block's kernel ``k`` as function
    ``100 + 10 * id + k``, the engine's own kernels from 5000 on. Also: function -> (block id, kernel)."""
    functions = {
        (b.id, ki): 100 + 10 * b.id + ki
        for b in snap.blocks
        for ki, spec in enumerate(b.description.kernels)
        if spec.source is not None
    }
    stamp = publish = None
    if engine_kernels:
        own, stamp_src, publish_src = engine_kernel_sources(plan)
        functions.update({key: 5000 + i for i, key in enumerate(sorted(own))})
        stamp = 4998 if stamp_src is not None else None
        publish = 4999 if publish_src is not None else None
    return functions, stamp, publish, {f: key for key, f in functions.items()}


def _realize(snap: Any, plan: Any, functions: dict, stamp: Any, publish: Any) -> Any:
    return realize(
        plan, device=StubDevice(), pool=BufferPool(), functions=functions, bindings=snap.bindings,
        block_names=snap.names, stamp_function=stamp, publish_function=publish,
    )  # type: ignore[arg-type]  # fmt: skip


def test_the_sent_snapshot_keeps_the_regions_and_the_hot_trigger() -> None:
    c, b = _loop_patch()
    snap = _sent(c)
    assert snap.parents == {b["beside"].id: b["loop"].id, b["bad"].id: b["loop"].id}
    (bad,) = [s for s in snap.blocks if s.id == b["bad"].id]
    assert bad.values["trigger"] == 1.0
    plan = replay_plan(snap)
    assert b["loop"].id in plan.regions
    bad_nodes = plan.block_nodes[b["bad"].id]
    assert bad_nodes and all(i in plan.scopes for i in bad_nodes)  # in the body, in the replayed plan too


@pytest.mark.parametrize("unroll", [None, 1, 3])
def test_a_loop_needs_the_engine_kernels_which_the_replay_now_loads(monkeypatch, unroll) -> None:
    install(monkeypatch, LaunchDriver(set()))
    c, b = _loop_patch(count=5, unroll=unroll)
    snap = _sent(c)
    plan = replay_plan(snap)
    own, stamp, publish = engine_kernel_sources(plan)
    assert publish is not None and plan.counters  # the iteration counter is published
    assert stamp is None  # no profiling in a replay
    region_nodes = {(n.block_id, n.kernel) for n in plan.kernel_nodes if n.block_id == b["loop"].id}
    assert region_nodes and set(own) == region_nodes
    assert all(k < 0 for _, k in own)  # the engine's entries, never a block's kernel index
    functions, stamp_fn, publish_fn, _ = _functions(snap, plan)
    assert {(n.block_id, n.kernel) for n in plan.kernel_nodes} <= set(functions)
    _realize(snap, plan, functions, stamp_fn, publish_fn).close()


def test_without_the_engine_kernels_realize_refuses_a_loop(monkeypatch) -> None:
    install(monkeypatch, LaunchDriver(set()))
    c, _ = _loop_patch()
    snap = _sent(c)
    plan = replay_plan(snap)
    functions, _, _, _ = _functions(snap, plan, engine_kernels=False)
    # What the replay process died of before: no block in a patch with a loop was ever named.
    with pytest.raises(CudapatchError, match="not compiled|not loaded"):
        _realize(snap, plan, functions, None, None)


@pytest.mark.parametrize("unroll", [None, 1, 3])
def test_a_fault_in_a_for_body_is_named_after_one_pass(monkeypatch, unroll) -> None:
    c, b = _loop_patch(count=5, unroll=unroll)
    snap = _sent(c)
    plan = replay_plan(snap)
    functions, stamp, publish, by_function = _functions(snap, plan)
    bad_fn = functions[(b["bad"].id, 0)]
    rec = install(monkeypatch, LaunchDriver({bad_fn}))
    g = _realize(snap, plan, functions, stamp, publish)
    assert g.replay(0) == b["bad"].id
    ran = [by_function[f][0] for f in rec.launched]
    assert ran == [b["fill"].id, b["beside"].id, b["bad"].id]  # set-condition kernels left out, bad once
    g.close()

    rec.faulting = set()  # no fault: everything's work once, loops and all, and no block named
    rec.launched.clear()
    g = _realize(snap, plan, functions, stamp, publish)
    assert g.replay(0) is None
    ran = [by_function[f][0] for f in rec.launched]
    assert ran == [b["fill"].id, b["beside"].id, b["bad"].id, b["after"].id]
    assert b["loop"].id not in ran
    g.close()


def test_replayed_nodes_keep_the_body_work_of_the_faulting_block() -> None:
    c, b = _loop_patch(count=7, unroll=3)
    plan = replay_plan(_sent(c))
    run = replayed_nodes(plan)
    work = [plan.nodes[i] for i in run if isinstance(plan.nodes[i], KernelNodePlan)]
    assert [n.block_id for n in work if n.block_id == b["bad"].id] == [b["bad"].id]
    assert len(plan.block_nodes[b["bad"].id]) > 1  # unrolled copies in the plan, one replayed
    assert run == sorted(run)


def test_the_replay_process_imports_what_this_process_finds_only_through_sys_path(tmp_path, monkeypatch) -> None:
    """The replay child starts with ``sys.executable``: a module this process imports only because its
    directory is on ``sys.path`` (as cudapatch in an embedded host) must import there too."""
    import subprocess
    import sys

    from cudapatch.engine import replay

    (tmp_path / "only_on_sys_path.py").write_text("WHERE = 'found'\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path, str(tmp_path / "gone")])
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    env = replay.replay_environment(3)
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths[0] == str(tmp_path) and paths[-1] == "/somewhere/else" and str(tmp_path / "gone") not in paths
    assert env["CUDAPATCH_REPLAY_DEVICE"] == "3" and env["CUDAPATCH_COMPILE_PROCESSES"] == "0"
    code = "import only_on_sys_path, cudapatch.engine.replay; print(only_on_sys_path.WHERE)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "found", done.stderr

    started = []

    class Popen:  # what ReplayStandby starts, recorded instead of run (the real one needs a GPU)
        def __init__(self, args, **kw):
            started.append((args, kw["env"]))

    monkeypatch.setattr(replay.subprocess, "Popen", Popen)
    replay.ReplayStandby(3)
    ((args, child_env),) = started
    assert args == [sys.executable, "-m", "cudapatch.engine.replay"] and child_env["PYTHONPATH"] == env["PYTHONPATH"]
