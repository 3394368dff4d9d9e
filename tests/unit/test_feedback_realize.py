"""The driver side of FrameDelay feedback and of the Upload/Download rings against the recording
stand-in for the driver (no GPU): two instantiations, phase 1 patched with the pair's pointers
swapped, init nodes disabled except for one launch, launches alternating, Hot updates reaching both
executables, a rebuild continuing the phase with the pair's allocations; the rings' pinned memory
bound to the blocks and written and read with plain loads and stores."""

from __future__ import annotations

import numpy as np
import pytest

import cudapatch.kernels._driver as driver_module
from cudapatch import Download, FrameDelay, Scale, Upload, compile_plan
from cudapatch.blocks.library.transfer import UPLOAD_SLOTS
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.bindings import binding_from_cai
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.nodes import KernelNode
from cudapatch.engine.params import read_slot
from cudapatch.engine.transfer import DownloadRing, UploadRing
from cudapatch.kernels.types import DType

from .recording_driver import OK, RecordingDriver, realize_recorded


class PhaseDriver(RecordingDriver):
    """Also records which executable each update goes to, and node enabling."""

    def cuGraphExecKernelNodeSetParams(self, exec_, node, kp):  # noqa: N802
        self._rec("set_params", exec_, node)
        return (OK,)

    def cuGraphNodeSetEnabled(self, exec_, node, on):  # noqa: N802
        self._rec("enabled", exec_, node, on)
        return (OK,)

    def cuMemsetD8Async(self, *a):  # noqa: N802 - the probes' scratch words are zeroed at the build
        return (OK,)

    def cuGraphExecMemsetNodeSetParams(self, exec_, node, mp, ctx):  # noqa: N802
        self._rec("set_memset", exec_, node, int(mp.dst))
        return (OK,)


@pytest.fixture
def rec(monkeypatch) -> PhaseDriver:
    fake = PhaseDriver()
    monkeypatch.setattr(driver_module, "_driver", fake)
    return fake


def _loop():
    ctx = Context()
    delay = ctx.register_block(FrameDelay(name="d", Count=64, Fill=1.0))
    scale = ctx.register_block(Scale(name="s", Factor=2.0))
    ctx.connect(delay, "Out", scale, "In")
    ctx.connect(scale, "Out", delay, "In")
    return ctx, delay, scale


def _node(g, plan, block) -> KernelNode:
    return g._nodes[plan.block_nodes[block.id][0]]


def test_realize_instantiates_twice_and_patches_phase_one_with_the_pair_swapped(rec) -> None:
    ctx, delay, scale = _loop()
    plan = compile_plan(ctx.snapshot())
    g = realize_recorded(ctx, plan, BufferPool())
    execs = [c[1] for c in rec.calls if c[0] == "instantiate"]
    assert len(execs) == 2
    exec0, exec1 = g._phases.execs
    dp = plan.delays[0]
    prev, cur = g.buffers[dp.previous].ptr, g.buffers[dp.current].ptr
    sn, dn = _node(g, plan, scale), _node(g, plan, delay)
    assert [read_slot(s) for s in sn.slots[:2]] == [prev, cur]  # phase 0: read previous, write current
    assert [read_slot(s) for s in sn.alt.slots[:2]] == [cur, prev]  # phase 1: swapped
    assert read_slot(dn.slots[1]) == prev and read_slot(dn.alt.slots[1]) == cur  # init writes what Out reads
    patched = {c[2] for c in rec.calls if c[0] == "set_params" and c[1] == exec1}
    assert patched == {sn.handle, dn.handle}
    disabled = {(c[1], c[2]) for c in rec.calls if c[0] == "enabled" and c[3] == 0}
    assert disabled == {(exec0, dn.handle), (exec1, dn.handle)}
    g.adopt(None)
    rec.calls.clear()
    for _ in range(3):
        g.launch(0)
    assert rec.calls == [
        ("enabled", exec0, dn.handle, 1),  # the first frame writes the start value ...
        ("launch", exec0),
        ("enabled", exec0, dn.handle, 0),  # ... once
        ("launch", exec1),
        ("launch", exec0),
    ]
    assert g.output(scale.id, "Out").ptr == cur and g.output(delay.id, "Out").ptr == prev  # phase 0 ran last
    g.launch(0)
    assert g.output(scale.id, "Out").ptr == prev and g.output(delay.id, "Out").ptr == cur
    g.close()
    assert {c[1] for c in rec.calls if c[0] == "destroy_exec"} == {exec0, exec1}


def test_hot_updates_and_resets_reach_both_phases(rec) -> None:
    ctx, delay, scale = _loop()
    plan = compile_plan(ctx.snapshot())
    g = realize_recorded(ctx, plan, BufferPool())
    g.adopt(None)
    g.launch(0)  # the init launch is behind us; phase 1 is next
    exec0, exec1 = g._phases.execs
    sn, dn = _node(g, plan, scale), _node(g, plan, delay)
    rec.calls.clear()
    assert g.update_scalars({(scale.id, "Factor"): 3.0}) == 1
    assert rec.calls == [("set_params", exec0, sn.handle), ("set_params", exec1, sn.handle)]
    assert read_slot(sn.slots[2]) == 3.0 and read_slot(sn.alt.slots[2]) == 3.0
    rec.calls.clear()
    g.update_scalars({(delay.id, "Reset"): 1})  # Reset feeds no kernel: it arms the init node
    g.launch(0)
    assert rec.calls == [("enabled", exec1, dn.handle, 1), ("launch", exec1), ("enabled", exec1, dn.handle, 0)]
    rec.calls.clear()
    assert not g.runs_function((scale.id, 0), 555)
    assert g.swap_function((scale.id, 0), 555, sn.plan.descriptor)  # Code tier
    assert int(sn.params.func) == 555 and int(sn.alt_params.func) == 555
    assert g.runs_function((scale.id, 0), 555) and not g.runs_function((scale.id + 1000, 0), 555)
    assert rec.calls == [("set_params", exec0, sn.handle), ("set_params", exec1, sn.handle)]
    g.close()


def test_a_rebuild_keeps_the_pair_and_continues_the_phase(rec) -> None:
    ctx, delay, scale = _loop()
    pool = BufferPool()
    plan = compile_plan(ctx.snapshot())
    g = realize_recorded(ctx, plan, pool)
    g.adopt(None)
    for _ in range(3):
        g.launch(0)
    other = ctx.register_block(Scale(name="elsewhere"))  # a structure edit outside the loop
    ctx.bind_input(other, "In", ExternalBinding(0xA000, 8, DType.FLOAT32))
    plan2 = compile_plan(ctx.snapshot())
    g2 = realize_recorded(ctx, plan2, pool, previous=g)
    g2.adopt(g)
    d1, d2 = plan.delays[0], plan2.delays[0]
    assert (g2.buffers[d2.previous].ptr, g2.buffers[d2.current].ptr) == (
        g.buffers[d1.previous].ptr,
        g.buffers[d1.current].ptr,
    )
    assert g2._phases.phase == g._phases.phase == 1 and not g2._phases.pending  # no start value again
    g.retire(0)
    g.close()
    g2.close()


def test_a_resized_delay_writes_its_start_value_again(rec) -> None:
    ctx, delay, scale = _loop()
    pool = BufferPool()
    g = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool)
    g.adopt(None)
    g.launch(0)
    delay.set("Count", 32)
    g2 = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool, previous=g)
    g2.adopt(g)
    assert g2._phases.pending == {0}
    g.retire(0)
    g.close()
    g2.close()


class _Binder:
    """What the rings need of an engine: ``bind``, through the engine's own CAI path."""

    def __init__(self) -> None:
        self.bound = {}

    def bind(self, block, port, array) -> None:
        self.bound[port] = binding_from_cai(array, block.description.input(port).dtype, block.name, port)


def test_rings_bind_their_mapped_memory_and_move_data_with_plain_stores_and_loads(rec) -> None:
    up, down = Upload(name="up", Type="float2", Count=5), Download(name="down", Type="uint")
    e1, e2 = _Binder(), _Binder()
    with UploadRing(e1, up) as feed, DownloadRing(e2, down, 7) as ring:
        assert e1.bound["Ring"].count == UPLOAD_SLOTS * 5 and e1.bound["Ring"].dtype is DType.FLOAT2
        assert e1.bound["Control"].count == 2 and e1.bound["Control"].ptr == e1.bound["Ring"].ptr + 8 * 4 * 5
        values = np.arange(10, dtype=np.float32).reshape(5, 2)
        assert feed.write(values) and feed._control[0] == 1
        np.testing.assert_array_equal(feed._data[1], values.reshape(-1))
        assert ring.read() is None
        ring._data[2] = np.arange(7, dtype=np.uint32) * 3  # as the kernel writes frame 2: data, then its word
        ring._control[1 + 2] = 2
        got, frame = ring.read()
        assert frame == 2 and got.tolist() == [0, 3, 6, 9, 12, 15, 18]
    assert feed.is_closed and ring.is_closed
    with pytest.raises(Exception, match="closed"):
        feed.write(values)


def test_a_node_by_node_replay_follows_the_phases(rec) -> None:
    from cudapatch.engine.phases import phase_nodes

    ctx, delay, scale = _loop()
    plan = compile_plan(ctx.snapshot())
    g = realize_recorded(ctx, plan, BufferPool())
    g.adopt(None)
    ph = g._phases
    dn, sn = plan.block_nodes[delay.id][0], plan.block_nodes[scale.id][0]
    nodes, buffers = phase_nodes(plan, g._nodes, g.buffers, ph)  # the first frame: init armed, phase 0
    assert nodes[dn] is g._nodes[dn] and nodes[sn] is g._nodes[sn] and buffers == g.buffers
    ph.pending, ph.phase = set(), 1
    nodes, buffers = phase_nodes(plan, g._nodes, g.buffers, ph)
    dp = plan.delays[0]
    assert nodes[dn] is None and nodes[sn].store is g._nodes[sn].alt
    assert buffers[dp.previous] is g.buffers[dp.current] and buffers[dp.current] is g.buffers[dp.previous]
    g.close()


def test_a_probe_on_a_wire_inside_the_loop_reads_the_other_buffer_in_phase_one(rec) -> None:
    ctx, delay, scale = _loop()
    ctx.add_probe(scale, "Out")
    plan = compile_plan(ctx.snapshot())
    (probe,) = [n for n in plan.nodes if type(n).__name__ == "ProbeNodePlan"]
    assert probe.buffer == plan.delays[0].current
    g = realize_recorded(ctx, plan, BufferPool(), probe_function=3, publish_function=2)
    exec1 = g._phases.execs[1]
    added = [c for c in rec.calls if c[0] == "add_kernel"]
    handle = added[probe.index][1]
    assert ("set_params", exec1, handle) in rec.calls
    g.close()


def test_a_child_graph_composite_beside_a_loop_is_patched_in_both_phases(monkeypatch) -> None:
    from cudapatch import Composite

    from .recording_driver import ChildGraphDriver

    class Driver(ChildGraphDriver, PhaseDriver):
        def cuGraphExecChildGraphNodeSetParams(self, exec_, node, graph):  # noqa: N802
            self._rec("child_params", exec_, node)
            return (OK,)

    class Pair(Composite):
        child_graph = True

        def compose(self, c) -> None:
            c.add("a", Scale(Factor=2.0))
            c.expose("In", "a.In")
            c.expose("Out", "a.Out")
            c.expose("Gain", "a.Factor")

    fake = Driver()
    monkeypatch.setattr(driver_module, "_driver", fake)
    ctx, delay, scale = _loop()
    pair = ctx.register_block(Pair(name="pair"))
    ctx.bind_input(pair, "In", ExternalBinding(0xA000, 64, DType.FLOAT32))
    plan = compile_plan(ctx.snapshot())
    assert len(plan.children) == 1 and len(plan.delays) == 1
    g = realize_recorded(ctx, plan, BufferPool())
    g.adopt(None)
    exec0, exec1 = g._phases.execs
    assert _node(g, plan, scale).alt is not None
    fake.calls.clear()
    g.update_scalars({(pair.inner("a").id, "Factor"): 5.0})
    assert {c[1] for c in fake.calls if c[0] == "child_params"} == {exec0, exec1}
    g.close()
