"""The engine's orchestration without a GPU: the real Engine, DeviceResources, KernelTracker,
FaultState, DiagnosticBoard, tiers and recovery, over a stand-in device, a stand-in kernel builder
(every compile finishes at once) and stand-in executable graphs that record what is asked of them.
The driver side of each step is tested on the GPU (tests/gpu: test_engine_gpu, test_code_tier_gpu,
test_fault_gpu, test_profiling_gpu)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from contextlib import nullcontext
from typing import Any

import pytest

from cudapatch import CustomKernel, DiagnosticCode, Engine, Fill, Scale
from cudapatch.blocks import BlockState
from cudapatch.engine import build as build_module
from cudapatch.engine import engine as engine_module
from cudapatch.engine import recovery as recovery_module
from cudapatch.engine import resources as resources_module
from cudapatch.errors import CudaError, CudaLaunchError
from cudapatch.kernels.builder import CompiledKernel
from cudapatch.kernels.pacing import FrameGate
from cudapatch.kernels.source import KernelImage

GAIN = """extern "C" __global__ void k(const float* in, float* out, float gain, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * gain;
}
"""


class FakeDevice:
    """The device side of DeviceResources: ``reset`` succeeds or is refused, as the test decides."""

    refuse_reset = False

    def __init__(self, ordinal: int = 0) -> None:
        self.ordinal, self.arch, self.key, self.compute_capability = ordinal, "sm_90", "0:sm_90", (9, 0)
        self.context, self.stream, self.upload_stream = object(), object(), object()
        self.resets, self.closed, self.abandoned, self.syncs = 0, False, False, 0

    def make_current(self) -> None:
        pass

    def synchronize(self) -> None:
        self.syncs += 1

    def reset(self) -> None:
        if FakeDevice.refuse_reset:
            raise CudaError("refused", name="CUDA_ERROR_ILLEGAL_ADDRESS")
        self.resets += 1
        self.stream = object()

    def abandon(self) -> None:
        self.abandoned = True

    def close(self) -> None:
        self.closed = True


class DeviceArray:
    """Device memory as CuPy would hand it over (only its interface is read)."""

    def __init__(self, n: int, ptr: int = 0x7F0000000000) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "version": 3}


class FakeModules:
    """A module cache that loads nothing (kernels are reloaded into a new one after a reset)."""

    def __init__(self, **_: Any) -> None:
        self.loaded = 0

    def function(self, image: Any) -> Any:
        self.loaded += 1
        return object()

    def close(self) -> None:
        pass

    def abandon(self) -> None:  # the context was reset under its modules: forgotten, never unloaded
        self.abandoned = True


class FakeBuilder:
    """Finishes every compile at once (as the builder's thread would, between frames)."""

    def __init__(self, **_: Any) -> None:
        self.gate = FrameGate()
        self.modules = None

    def submit(self, source: Any) -> Future:
        f: Future = Future()
        f.set_result(CompiledKernel(source, KernelImage(source.describe(), b"", "cubin", "k", "k.cu"), object(), "", 0))
        return f

    def build(self, source: Any) -> Any:
        return self.submit(source).result()

    def build_cached(self, source: Any) -> Any:
        return None  # nothing is cached: every kernel goes through ``submit``

    def unpaced(self) -> nullcontext:
        return nullcontext()

    def close(self) -> None:
        pass


class _Allocation:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes


class FakeGraph:
    """An executable graph that records launches, patches and swaps. ``fault`` makes launches fault."""

    fault = False

    def __init__(self, plan: Any, **kw: Any) -> None:
        self.plan, self.readback, self.appends, self.occupancy = plan, None, {}, {}
        self.functions = dict(kw.get("functions") or {})
        self.kernel_count = sum(1 for n in plan.nodes if hasattr(n, "descriptor"))
        self.recaptures, self.call_errors, self.stale, self.counters = 0, {}, False, None
        self.has_calls = False  # no captured library calls: nothing re-captures
        self.instantiations, self.reallocations, self.exec_updates = 1, 0, 0
        self.launches, self.scalars, self.swaps, self.bypasses = 0, [], [], []
        self.closed = self.abandoned = self.retired = False
        self.buffers = [_Allocation(0) for _ in plan.buffers]  # nothing fits, try_patch refuses: every edit is Cold

    def launch(self, stream: Any) -> None:
        if FakeGraph.fault:
            raise CudaLaunchError("an illegal memory access", name="CUDA_ERROR_ILLEGAL_ADDRESS")
        self.launches += 1

    def update_scalars(self, params: dict) -> int:
        self.scalars.append(dict(params))
        return len(params)

    def update_bindings(self, bindings: dict) -> int:
        return len(bindings)

    def swap_function(self, key: tuple[int, int], function: Any, descriptor: Any, source: Any = None) -> bool:
        self.swaps.append(key)
        self.functions[key] = function  # what ``runs_function`` answers from then on
        return True

    def runs_function(self, key: tuple[int, int], function: Any) -> bool:  # as CompiledGraph: a node of its own
        nodes = self.plan.nodes  # (the block's nodes looked up, as the real one does: bench_swap_cpu times this)
        own = any(
            (getattr(nodes[i], "block_id", None), getattr(nodes[i], "kernel", None)) == key
            for i in self.plan.block_nodes.get(key[0], ())
        )
        return own and self.functions.get(key) is function

    def try_patch(self, plan: Any, bindings: Any, functions: Any, *, decided: Any = None) -> int | None:
        return None  # always Cold

    def adopt(self, previous: Any) -> None:
        pass

    def retire(self, stream: Any) -> None:
        self.retired = True

    def is_idle(self) -> bool:
        return True

    def give_back_stores(self) -> None:  # as CompiledGraph: only once retired
        assert self.retired and not self.closed
        self.gave_back_on = threading.current_thread().name

    def stock_spares(self, stop: Any = None, give_up: Any = None) -> None:
        self.stocked_on = threading.current_thread().name
        self.stocks = getattr(self, "stocks", 0) + 1

    def close(self) -> None:
        self.closed = True
        self.closed_on = threading.current_thread().name

    def abandon(self) -> None:
        self.abandoned = True

    def output(self, block_id: int, port: str) -> Any:
        bi = self.plan.outputs.get((block_id, port))
        return None if bi is None else ("buffer", bi)

    def overwritten(self, block_id: int, port: str) -> bool:
        return False

    def set_bypass(self, bp: Any, copies: Any = None) -> int:
        self.bypasses.append(bp)
        return len(bp.disabled) + len(bp.redirects)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(resources_module, "DeviceContext", FakeDevice)
    monkeypatch.setattr(resources_module, "ModuleCache", FakeModules)
    monkeypatch.setattr(engine_module, "KernelBuilder", FakeBuilder)
    monkeypatch.setattr(build_module, "realize", FakeGraph)
    monkeypatch.setattr(FakeDevice, "refuse_reset", False)
    monkeypatch.setattr(FakeGraph, "fault", False)
    e = Engine(cache_dir=False, watch_files=False, background_builds=False)  # builds in update() (see test_live_builds)
    yield e
    e.close()


@pytest.fixture
def unfused(engine: Engine) -> Any:
    """The ``engine`` fixture's stand-ins, in an engine that never fuses (tests of one node per block)."""
    e = Engine(cache_dir=False, watch_files=False, background_builds=False, fuse=False)
    yield e
    e.close()


def _chain(e: Engine) -> tuple[Any, Any]:
    fill = e.add(Fill(name="fill", Count=1024, Value=2.0))
    scale = e.add(Scale(name="scale", Factor=3.0))
    e.connect(fill, "Out", scale, "In")
    return fill, scale


def test_cold_then_hot_then_clean_frames(engine: Engine) -> None:
    fill, scale = _chain(engine)
    engine.update()  # builds without the blocks: their kernels are compiling
    assert engine.graph is not None and not engine.graph.plan.block_order
    assert str(scale).startswith("scale: NotCompiled")
    engine.update()  # the compiles landed: rebuilt with them
    g = engine.graph
    assert isinstance(g, FakeGraph) and engine.counters.rebuilds == 2 and g.launches == 1
    assert set(g.plan.block_order) == {fill.id, scale.id} and str(scale).startswith("scale: OK")
    scale.set("Factor", 5.0)
    engine.update()
    assert engine.counters.hot_updates == 1 and [list(p) for p in g.scalars] == [[(scale.id, "Factor")]]
    launches = g.launches
    for _ in range(3):
        engine.update()  # clean: a launch each, nothing else
    assert g.launches == launches + 3 and engine.counters.rebuilds == 2 and engine.graph is g
    engine.add(Scale(name="more"))  # Cold: a new graph; the old one retires
    engine.update()
    assert engine.graph is not g and g.retired and not g.closed and engine.counters.rebuilds == 3
    engine.add(Scale(name="again"))  # the next build reaps it (idle)
    engine.update()
    assert g.closed and len(engine.resources.retired) == 1


def test_a_code_edit_is_swapped_in_between_frames(engine: Engine) -> None:
    fill = engine.add(Fill(name="fill", Count=256))
    ck = engine.add(CustomKernel(name="ck", Code=GAIN))
    engine.connect(fill, "Out", ck, "in")
    engine.wait_ready()
    g = engine.graph
    assert g is not None and ck.id in g.plan.block_order
    ck.set("Code", GAIN.replace("gain;", "gain * 2.0f;"))  # same signature: the Code tier
    assert engine.counters.code_swaps == 1 and g.swaps == [(ck.id, 0)]
    engine.update()
    assert engine.graph is g and engine.counters.rebuilds == 1


def test_a_fault_disables_its_block_and_a_refused_reset_loses_the_engine(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill, scale = _chain(engine)
    engine.wait_ready()
    monkeypatch.setattr(recovery_module, "attribute_in_child", lambda snap, **_: (scale.id, "faulted"))
    monkeypatch.setattr(FakeDevice, "refuse_reset", True)
    monkeypatch.setattr(FakeGraph, "fault", True)
    g = engine.graph
    engine.update()
    assert engine.counters.faults == 1 and engine.graph is None and g is not None and g.abandoned
    assert engine.lost is not None and "block 'scale'" in engine.lost and "restart" in engine.lost
    codes = {(d.block_id, d.code) for d in engine.diagnostics()}
    assert (scale.id, DiagnosticCode.GPU_FAULT) in codes and (None, "gpu-lost") in codes
    assert scale.debug.state is BlockState.ERROR and fill.debug.state is BlockState.NOT_COMPILED
    frames = engine.counters.frames
    engine.update()  # no launch, no exception
    assert engine.counters.frames == frames + 1
    device = engine.device
    engine.close()  # forgets, frees nothing
    assert device.abandoned and not device.closed  # type: ignore[attr-defined]


def test_a_replaced_process_takes_its_prepared_replay_and_skips_the_reset(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Standby:  # a replay process started before the engine (the isolated child's warm-up)
        def __init__(self, device: int) -> None:
            self.device, self.closed = device, False

        def close(self) -> None:
            self.closed = True

    started: list[Standby] = []
    monkeypatch.setattr(engine_module, "ReplayStandby", lambda device: started.append(Standby(device)) or started[-1])
    other = Standby(engine.device.ordinal + 1)
    engine.prepare_fault_replay(other, reset=False)  # another device's: closed, a new one started
    assert other.closed and [s.device for s in started] == [engine.device.ordinal]
    ready = Standby(engine.device.ordinal)
    engine.prepare_fault_replay(ready, reset=False)  # one is prepared already: this one is closed
    assert ready.closed
    ready = engine._recovery.replay_standby
    fill, scale = _chain(engine)
    engine.wait_ready()
    used = []

    def attribute(snap, *, standby, times, **_):
        used.append(standby)
        times["replay_read"] = time.monotonic()
        return scale.id, "faulted"

    monkeypatch.setattr(recovery_module, "attribute_in_child", attribute)
    monkeypatch.setattr(FakeGraph, "fault", True)
    engine.update()
    assert used == [ready] and ready is started[0] and not ready.closed
    assert engine.device.resets == 0  # type: ignore[attr-defined]  (it would have been allowed)
    assert engine.lost is not None and "a reset was not tried" in engine.lost and "block 'scale'" in engine.lost
    assert list(engine.fault_times) == ["surfaced", "replay_read", "named", "reset"]
    assert list(engine.fault_times.values()) == sorted(engine.fault_times.values())


def test_a_fault_with_a_reset_rebuilds_without_the_block_until_its_code_changes(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill = engine.add(Fill(name="fill", Count=256))
    ck = engine.add(CustomKernel(name="ck", Code=GAIN))
    after = engine.add(Scale(name="after"))
    ext = engine.add(Scale(name="ext"))
    engine.connect(fill, "Out", ck, "in")
    engine.connect(ck, "out", after, "In")
    engine.bind(ext, "In", DeviceArray(256))
    engine.wait_ready()
    assert ext.id in engine.graph.plan.block_order  # type: ignore[union-attr]
    monkeypatch.setattr(recovery_module, "attribute_in_child", lambda snap, **_: (ck.id, "faulted"))
    before = engine.stream
    monkeypatch.setattr(FakeGraph, "fault", True)
    engine.update()
    monkeypatch.setattr(FakeGraph, "fault", False)
    assert engine.lost is None and engine.device.resets == 1  # type: ignore[attr-defined]
    assert engine.resources.stream is engine.device.stream
    assert engine.stream is engine.device.stream and engine.stream is not before  # renewed with the context
    engine.update()  # the rebuild leaves the faulted kernel out and warns its reader
    g = engine.graph
    assert g is not None and engine.counters.rebuilds == 2
    codes = {(d.block_id, d.code) for d in engine.diagnostics()}
    assert (ck.id, DiagnosticCode.GPU_FAULT) in codes and (after.id, DiagnosticCode.INPUT_FAULTED) in codes
    assert (ext.id, DiagnosticCode.BINDING_LOST) in codes and ext.id not in g.plan.block_order  # unbound
    assert not any(getattr(n, "block_id", None) == ck.id and hasattr(n, "descriptor") for n in g.plan.nodes)
    engine.bind(ext, "In", DeviceArray(256))  # bound again: the warning goes
    ck.set("Code", GAIN.replace("gain;", "gain * 2.0f;"))  # new code: a new chance
    engine.update()
    engine.update()
    assert not engine.diagnostics(), engine.diagnostics()
    assert str(ck).startswith("ck: OK") and str(ext).startswith("ext: OK")


def test_disable_and_remove(engine: Engine) -> None:
    fill, scale = _chain(engine)
    engine.wait_ready()
    engine.disable(scale, "faulted in an earlier process")
    engine.update()
    (d,) = engine.diagnostics(scale)
    assert d.code == "gpu-fault" and d.message == "faulted in an earlier process"
    engine.remove(scale)
    engine.update()
    assert not engine.diagnostics() and engine.graph is not None and scale.id not in engine.graph.plan.block_order


def test_an_expression_edit_runs_its_quick_build_then_swaps_in_the_optimised_one(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudapatch import Expression
    from cudapatch.engine import kernels as kernels_module

    monkeypatch.setattr(kernels_module, "UPGRADE_AFTER_S", 0)  # the optimised build at once, in this thread

    fill = engine.add(Fill(name="fill", Count=256))
    ex = engine.add(Expression(name="ex", Code="x * Gain"))
    engine.connect(fill, "Out", ex, "x")
    engine.wait_ready()
    g = engine.graph
    assert g is not None and ex.id in g.plan.block_order
    swaps, upgrades = engine.counters.code_swaps, engine.counters.kernel_upgrades
    ex.set("Code", "x * Gain + 1.5")  # same names: the Code tier, quick build first
    assert engine.counters.code_swaps == swaps + 1 and engine.counters.kernel_upgrades == upgrades + 1
    assert g.swaps[-2:] == [(ex.id, 0), (ex.id, 0)]  # the quick build, then its optimised build
    engine.update()
    assert engine.graph is g and engine.counters.rebuilds == 1  # neither asked for a rebuild


def test_a_fused_members_edit_swaps_the_groups_quick_kernel_then_its_optimised_one(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudapatch import Expression
    from cudapatch.engine import kernels as kernels_module

    monkeypatch.setattr(kernels_module, "UPGRADE_AFTER_S", 0)
    from cudapatch.engine.compiler.fusion import FUSED_KERNEL

    e = Engine(cache_dir=False, watch_files=False, background_builds=False, fuse=True)
    try:
        fill = e.add(Fill(name="fill", Count=256))
        ex = e.add(Expression(name="ex", Code="x * Gain"))
        sc = e.add(Scale(name="sc"))
        e.connect(fill, "Out", ex, "x")
        e.connect(ex, "Out", sc, "In")
        e.wait_ready()
        g = e.graph
        assert isinstance(g, FakeGraph)
        (node,) = [n for n in g.plan.kernel_nodes if n.kernel == FUSED_KERNEL]
        assert node.source.jit == "full"  # a build makes the optimised kernel at once
        ex.set("Code", "x * Gain + 1.5")
        e.update()
        key = (sc.id, FUSED_KERNEL)
        assert g.swaps.count(key) == 2 and e.counters.kernel_upgrades >= 1  # quick, then optimised
        assert e.graph is g and e.counters.rebuilds == 1
    finally:
        e.close()


def test_a_bypass_is_applied_to_the_running_graph_then_to_every_graph_a_build_swaps_in(unfused: Engine) -> None:
    engine = unfused  # scale and after would fuse: see the next test for a bypass inside a fused group
    fill, scale = _chain(engine)
    after = engine.add(Scale(name="after"))
    engine.connect(scale, "Out", after, "In")
    engine.wait_ready()
    g = engine.graph
    assert g is not None and g.bypasses == []  # nothing bypassed: a build does not call it
    scale.enabled = False
    engine.update()
    (bp,) = g.bypasses
    scale_out, fill_out = g.plan.outputs[(scale.id, "Out")], g.plan.outputs[(fill.id, "Out")]
    assert bp.disabled == set(g.plan.block_nodes[scale.id]) and set(bp.redirects.values()) == {fill_out}
    assert bp.outputs == {(scale.id, "Out"): fill_out} and scale_out != fill_out
    assert engine.graph is g and engine.counters.bypass_updates == 1 and engine.counters.rebuilds == 1
    assert g.launches == 1 and "(bypassed)" in str(scale) and not engine.context.dirty.any  # clean again
    engine.update()  # clean: no bypass work
    assert len(g.bypasses) == 1
    engine.add(Scale(name="more"))  # Cold: each new graph gets the bypass before its first launch
    engine.wait_ready()
    g2 = engine.graph
    assert g2 is not g and g2.launches == 0 and g2.bypasses and g2.bypasses[-1].disabled == bp.disabled
    scale.enabled = True
    engine.update()
    assert engine.graph is g2 and g2.bypasses[-1].empty and g2.launches == 1
    engine.add(Scale(name="again"))
    engine.wait_ready()
    assert engine.graph is not g2 and engine.graph.bypasses == []  # nothing bypassed: nothing to apply


def test_a_bypass_whose_values_share_buffers_builds_them_their_own_then_applies(unfused: Engine) -> None:
    from cudapatch.engine.memory_plan import shares_with_others

    engine = unfused  # buffer reuse on: the chain's values take turns in a few buffers
    blocks = [engine.add(Scale(name=f"s{i}", Factor=1.0 + i / 1000)) for i in range(150)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        engine.connect(a, "Out", b, "In")
    engine.bind(blocks[0], "In", DeviceArray(4099))
    engine.wait_ready()
    g, s40 = engine.graph, blocks[40]
    assert g is not None and shares_with_others(g.plan, {s40.id})
    s40.enabled = False
    engine.update()  # builds here (no build thread): the graph with 40's values pinned, bypassed at once
    g2 = engine.graph
    assert g2 is not g and not shares_with_others(g2.plan, {s40.id})
    assert not any(bp.disabled or bp.redirects for bp in g.bypasses)  # (at most carried, until g2 came)
    (bp,) = g2.bypasses
    s39_out = g2.plan.outputs[(blocks[39].id, "Out")]
    (reader,) = g2.plan.block_nodes[blocks[41].id]
    assert bp.disabled == set(g2.plan.block_nodes[s40.id]) and bp.redirects == {(reader, 0): s39_out}
    assert g2.launches == 1 and not engine.context.dirty.any
    for on in (True, False, True):
        s40.enabled = on
        engine.update()
        assert engine.graph is g2 and g2.bypasses[-1].empty is on
    assert engine.counters.rebuilds == 2 and g2.bypasses[-2] is bp


def test_a_toggle_reuses_the_decision_made_for_the_same_blocks_and_plan(unfused: Engine) -> None:
    from cudapatch.engine.bypass import BypassIndex, plan_bypass

    engine = unfused
    fill, scale = _chain(engine)
    engine.connect(scale, "Out", engine.add(Scale(name="after")), "In")
    engine.wait_ready()
    g = engine.graph
    for on in (False, True, False, True, False):
        scale.enabled = on
        engine.update()
    assert engine.graph is g and engine.counters.bypass_updates == 5 and engine.counters.rebuilds == 1
    off, on = g.bypasses[0], g.bypasses[1]
    assert g.bypasses[2] is off and g.bypasses[4] is off and g.bypasses[3] is on  # decided once each
    assert off == plan_bypass(BypassIndex(g.plan), {scale.id})  # what deciding afresh gives


def test_a_bypass_inside_a_fused_group_rebuilds_the_group_without_the_block_then_applies(engine: Engine) -> None:
    from cudapatch.engine.compiler.fusion import FUSED_KERNEL

    fill, scale = _chain(engine)
    after = engine.add(Scale(name="after", Factor=0.5))
    last = engine.add(Scale(name="last", Offset=1.0))
    engine.connect(scale, "Out", after, "In")
    engine.connect(after, "Out", last, "In")
    engine.wait_ready()
    g = engine.graph
    (fused,) = [n for n in g.plan.kernel_nodes if n.kernel == FUSED_KERNEL]
    assert fused.source.members == (scale.id, after.id, last.id) and "fused" in str(scale)
    rebuilds = engine.counters.rebuilds
    scale.enabled = False
    # The group's node computes after and last too: nothing of it is turned off; the same update builds
    # the graph with scale on its own node (after and last still one fused kernel) and bypasses it there.
    engine.update()
    assert all(bp.empty for bp in g.bypasses) and g.launches == 0
    g2 = engine.graph
    assert g2 is not g and engine.counters.rebuilds == rebuilds + 1
    (fused,) = [n for n in g2.plan.kernel_nodes if n.kernel == FUSED_KERNEL]
    assert fused.source.members == (after.id, last.id) and scale.id not in fused.source.members
    (own,) = g2.plan.block_nodes[scale.id]
    bp = g2.bypasses[-1]  # applied to the new graph before its first launch
    fill_out = g2.plan.outputs[(fill.id, "Out")]
    assert bp.disabled == {own} and own != fused.index and bp.outputs == {(scale.id, "Out"): fill_out}
    assert set(bp.redirects) == {(fused.index, 0)} and set(bp.redirects.values()) == {fill_out}
    assert "(bypassed)" in str(scale) and "fused: after -> last" in str(after)
    engine.update()  # clean: no rebuild loop
    assert engine.graph is g2 and not engine.context.dirty.any
    scale.enabled = True  # on again: its own node runs (it joins a group at the next structure edit)
    engine.update()
    assert engine.graph is g2 and g2.bypasses[-1].empty


def test_reading_a_fused_intermediate_raises_once_and_the_next_build_keeps_it(engine: Engine) -> None:
    from cudapatch.engine.compiler.fusion import FUSED_KERNEL
    from cudapatch.errors import CudapatchError

    fill, scale = _chain(engine)
    mid = engine.add(Scale(name="mid", Factor=0.5))
    last = engine.add(Scale(name="last", Offset=1.0))
    engine.connect(scale, "Out", mid, "In")
    engine.connect(mid, "Out", last, "In")
    engine.wait_ready()
    g = engine.graph
    (fused,) = [n for n in g.plan.kernel_nodes if n.kernel == FUSED_KERNEL]
    assert fused.source.members == (scale.id, mid.id, last.id)
    assert engine.output(last, "Out") is not None  # the group's sink has its buffer
    with pytest.raises(CudapatchError, match="fused kernel") as err:
        engine.output(mid, "Out")
    assert err.value.block == "mid" and (mid.id, "Out") in engine.context.kept
    engine.update()  # the host reads mid: the group ends there
    g2 = engine.graph
    assert g2 is not g
    (fused,) = [n for n in g2.plan.kernel_nodes if n.kernel == FUSED_KERNEL]
    assert fused.source.members == (scale.id, mid.id) and g2.plan.block_nodes[last.id] != (fused.index,)
    assert engine.output(mid, "Out") is not None and engine.output(last, "Out") is not None


def test_a_fused_kernel_that_does_not_load_leaves_the_patch_running_unfused(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudapatch.engine.compiler.fusion import FusedSource
    from cudapatch.errors import KernelLoadError

    real = FakeBuilder.build

    def build(self: FakeBuilder, source: Any) -> Any:
        if isinstance(source, FusedSource):
            raise KernelLoadError("ptxas: boom")
        return real(self, source)

    monkeypatch.setattr(FakeBuilder, "build", build)
    fill, scale = _chain(engine)
    after = engine.add(Scale(name="after"))
    engine.connect(scale, "Out", after, "In")
    engine.wait_ready()
    g = engine.graph
    assert g is not None and set(g.plan.block_order) >= {fill.id, scale.id, after.id}
    assert len(g.plan.kernel_nodes) == 3  # one node per block, as with fuse=False
    (warning,) = [d for d in engine.diagnostics(after) if d.code == DiagnosticCode.REALIZE]
    assert warning.severity == "warning" and "scale -> after" in warning.message and "boom" in warning.message


def test_an_expression_edited_again_before_its_optimised_build_starts_never_builds_the_old_one(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudapatch import Expression
    from cudapatch.engine import kernels as kernels_module

    timers: list = []
    monkeypatch.setattr(kernels_module, "after_settling", timers.append)  # the timer, held by the test
    fill = engine.add(Fill(name="fill", Count=256))
    ex = engine.add(Expression(name="ex", Code="x * Gain"))
    engine.connect(fill, "Out", ex, "x")
    engine.wait_ready()
    upgrades = engine.counters.kernel_upgrades
    ex.set("Code", "x * Gain + 1.5")
    ex.set("Code", "x * Gain + 2.5")  # typed on: the first edit's optimised build is not wanted any more
    first, second = timers[-2:]
    first()
    engine.update()
    assert engine.counters.kernel_upgrades == upgrades  # skipped: a newer edit runs
    second()
    engine.update()
    assert engine.counters.kernel_upgrades == upgrades + 1


def test_synchronize_lets_frame_hooks_finish_their_gl_work_before_it_blocks(engine: Engine) -> None:
    """Frame hooks get ``before_wait()`` before the thread blocks on the engine's stream (a GL bridge of
    an isolated engine copies the last frame in there, so GL holds it once ``synchronize`` returns)."""
    order: list[str] = []

    class Hook:
        def before_launch(self, stream: Any) -> None:
            order.append("map")

        def after_launch(self, stream: Any) -> None:
            order.append("unmap")

        def before_wait(self) -> None:
            order.append(f"finish GL (stream waits so far: {engine.device.syncs})")

    engine.add(Fill(name="f", Count=16))
    engine.add_frame_hook(Hook())
    engine.update()
    before = engine.device.syncs
    engine.synchronize()
    assert order[-1] == f"finish GL (stream waits so far: {before})" and engine.device.syncs == before + 1


class _Hook:
    """A frame hook that does nothing: with one, ``update()`` takes its general path, not the inline one."""

    def before_launch(self, stream: Any) -> None:
        pass

    def after_launch(self, stream: Any) -> None:
        pass

    def before_wait(self) -> None:
        pass


@pytest.mark.parametrize("path", ["inline", "general"])
def test_both_frame_paths_report_a_refused_launch_and_survive_a_fault_alike(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The quiet frame's inline path and ``_frame`` each launch: a refused launch is raised and put on
    the board as ``launch``, with the frame not counted; a fault surfacing in the launch is recovered
    from (the culprit disabled, a new graph built) without raising, and the frame still opens the gate
    of a builder waiting for it."""
    fill, scale = _chain(engine)
    engine.wait_ready()
    if path == "general":
        engine.add_frame_hook(_Hook())
    engine.update()
    g, frames = engine.graph, engine.counters.frames

    def refuse(stream: Any) -> None:
        raise CudaError("the launch was refused", name="CUDA_ERROR_INVALID_VALUE")

    g.launch = refuse  # type: ignore[method-assign]
    with pytest.raises(CudaError, match="refused"):
        engine.update()
    assert engine.counters.frames == frames and engine.graph is g
    assert any(d.code == DiagnosticCode.LAUNCH and "refused" in d.message for d in engine.diagnostics())
    del g.launch  # the class's again
    monkeypatch.setattr(recovery_module, "attribute_in_child", lambda snap, **_: (scale.id, "faulted"))
    monkeypatch.setattr(FakeGraph, "fault", True)
    gate = _WantedGate()
    monkeypatch.setattr(engine, "_gate", gate)  # the kernel builder waits for the end of a frame
    copies = engine.resources.copy_kernels()
    engine.update()  # no exception: recovered
    assert engine.counters.faults == 1 and g.abandoned and engine.lost is None
    reloaded = engine.resources.copy_kernels()  # asked for again in the new context (a bypass carries with them)
    assert copies is not None and reloaded is not None and reloaded is not copies
    assert scale.debug.state is BlockState.ERROR
    assert gate.opened == 1, "the frame that recovered did not let the waiting builder run"


class _WantedGate:
    """A builder's frame gate with work waiting: counts how often a frame opens it."""

    wanted = True

    def __init__(self) -> None:
        self.opened = 0

    def open(self) -> None:
        self.opened += 1


def test_a_warm_patch_the_driver_refuses_midway_is_followed_by_a_new_graph(engine: Engine) -> None:
    """A Warm resize the driver refuses after some nodes were written leaves the running graph patched
    in part: the build counts as failed (its error logged and put on the board) and the next build is
    Cold, from the plan; once that runs, the error is gone from the board."""
    fill, scale = _chain(engine)
    engine.wait_ready()
    engine.update()
    g = engine.graph
    assert g is not None

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise CudaError("cuGraphExecKernelNodeSetParams refused a node", name="CUDA_ERROR_INVALID_VALUE")

    g.try_patch = refuse  # type: ignore[method-assign]
    failed = engine.counters.failed_rebuilds
    fill.set("Count", 2048)  # sizes only: a Warm resize of the running graph
    engine.update()
    assert engine.counters.failed_rebuilds == failed + 1
    assert engine.graph is not g and engine.graph is not None and g.retired, "the half-patched graph runs on"
    assert engine.graph.plan.buffers[engine.graph.plan.outputs[(scale.id, "Out")]].count == 2048


def test_wait_ready_builds_with_every_kernel_through_the_applier_and_keeps_the_setting(engine: Engine) -> None:
    fill, scale = _chain(engine)
    assert engine._applier.off_thread is False  # this fixture builds in update(): background_builds=False
    engine.wait_ready()
    g = engine.graph
    assert g is not None and set(g.plan.block_order) == {fill.id, scale.id} and g.launches == 0  # built, not run
    assert engine.wait_for_compile is False  # waiting was for this call only
    engine.background_builds = True
    assert engine._applier.off_thread  # the applier reads the engine's settings when it applies
    engine.wait_for_compile = True
    assert not engine._applier.off_thread


def test_a_frame_a_build_lands_in_leaves_specialisations_to_the_next(engine: Engine, monkeypatch) -> None:
    """The Code tier is told not to land specialisations in the frame that swaps a build in (that frame
    costs the most; a new graph refuses what was made for the old one), and told to in the next."""
    from types import SimpleNamespace

    from cudapatch.engine.kernels import KernelOutcome

    _chain(engine)
    engine.wait_ready()
    told: list[bool] = []
    monkeypatch.setattr(engine._code, "apply", lambda outcomes, *, specialize=True: told.append(specialize))
    landed: list[bool] = []
    monkeypatch.setattr(engine._structure, "finish", lambda: landed.append(True))
    worker = engine._worker
    outcome = KernelOutcome("specialize", (1, 0), None, (), None)
    engine._worker = SimpleNamespace(done=True, busy=False, tailing=False)  # a build finished: it lands now
    try:
        engine.kernels.ready.append(outcome)
        engine.update()
        engine._worker.done = False
        engine.kernels.ready.append(outcome)
        engine.update()
    finally:
        engine._worker = worker
    assert landed == [True] and told == [False, True]
