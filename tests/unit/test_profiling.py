"""Profiling without a GPU: levels, event placement in the plan, tooltip formats."""

from __future__ import annotations

import pytest

from cudapatch import AppendFilter, Fill, ProfilingLevel, Scale, VectorAdd
from cudapatch.blocks import BlockState
from cudapatch.engine import Context, KernelNodePlan, MemsetNodePlan, StampNodePlan
from cudapatch.engine.plan import PublishNodePlan
from cudapatch.errors import CudapatchError

from .unfused import compile_plan  # one node per block: these tests are about unfused plans


def _patch() -> tuple[Context, list]:
    c = Context()
    f = c.register_block(Fill(name="f", Count=1000))
    s = c.register_block(Scale(name="s"))
    a = c.register_block(VectorAdd(name="a"))
    k = c.register_block(AppendFilter(name="k"))
    c.connect(f, "Out", s, "In")
    c.connect(f, "Out", a, "A")
    c.connect(s, "Out", a, "B")
    c.connect(a, "Sum", k, "In")
    return c, [f, s, a, k]


def _check_order(plan) -> None:
    for n in plan.nodes:
        assert all(d < n.index for d in n.deps), n  # dependencies point backwards: a valid launch order
    assert [n.index for n in plan.nodes] == list(range(len(plan.nodes)))


def test_level_names() -> None:
    assert ProfilingLevel.parse("PerBlock") is ProfilingLevel.PER_BLOCK
    assert ProfilingLevel.parse("deep_sync") is ProfilingLevel.DEEP_SYNC
    assert ProfilingLevel.parse(ProfilingLevel.NONE) is ProfilingLevel.NONE
    with pytest.raises(CudapatchError, match=r"unknown profiling level 'Fast' \(levels: None, Summary, PerBlock"):
        ProfilingLevel.parse("Fast")
    assert ProfilingLevel.PER_KERNEL.at_least(ProfilingLevel.PER_BLOCK) and not ProfilingLevel.NONE.timed


def test_none_places_no_events() -> None:
    c, _ = _patch()
    plan = compile_plan(c.snapshot())
    assert not any(isinstance(n, StampNodePlan) for n in plan.nodes) and plan.stamp_count == 0 and not plan.timings


@pytest.mark.parametrize(
    ("level", "events", "pairs"),
    [
        (ProfilingLevel.SUMMARY, 2, 1),
        (ProfilingLevel.PER_BLOCK, 8, 5),
        (ProfilingLevel.PER_KERNEL, 8, 9),
        (ProfilingLevel.DEEP_SYNC, 8, 9),
    ],
)
def test_event_placement(level: ProfilingLevel, events: int, pairs: int) -> None:
    c, (f, s, a, k) = _patch()
    plan = compile_plan(c.snapshot(), level=level)
    _check_order(plan)
    ev = [n for n in plan.nodes if isinstance(n, StampNodePlan)]
    # Stamp 1 (the graph's end) is written by the publish node, so it is a slot without a node.
    assert len(ev) + 1 == events == plan.stamp_count and len(plan.timings) == pairs
    first, last = plan.nodes[0], plan.nodes[-1]
    assert isinstance(first, StampNodePlan) and first.stamp == 0 and not first.deps  # the graph starts here
    assert isinstance(last, PublishNodePlan) and last.end_stamp == 1  # the end time, then the readback
    kernels = [n for n in plan.nodes if isinstance(n, KernelNodePlan)]
    used = {d for n in plan.nodes for d in n.deps}
    assert all(n.index in used for n in plan.nodes[:-1]), "every node leads to the end"
    roots = [n for n in plan.nodes[1:] if not isinstance(n, StampNodePlan) and n.deps == (0,)]
    assert roots and all(0 in n.deps for n in plan.nodes[1:] if not n.deps or n.deps == (0,))
    by_block = {n.block_id: n for n in kernels}

    def reaches(src: int, dst: int) -> bool:
        stack, seen = [dst], set()
        while stack:
            x = stack.pop()
            if x == src:
                return True
            if x not in seen:
                seen.add(x)
                stack.extend(plan.nodes[x].deps)
        return False

    assert reaches(by_block[f.id].index, by_block[s.id].index) and reaches(by_block[s.id].index, by_block[a.id].index)
    memset = next(n for n in plan.nodes if isinstance(n, MemsetNodePlan))
    assert reaches(memset.index, by_block[k.id].index)
    # slots follow the renumbering
    ((ni, ai),) = plan.scalar_slots[(s.id, "Factor")]
    assert plan.nodes[ni] is by_block[s.id] and ai == 2
    if level.at_least(ProfilingLevel.PER_BLOCK):
        block_pairs = {p.key: p for p in plan.timings if p.kind == "block"}
        assert set(block_pairs) == {f.id, s.id, a.id, k.id}
        start = next(n for n in ev if n.stamp == block_pairs[a.id].start)
        end = next(n for n in ev if n.stamp == block_pairs[a.id].end)
        assert reaches(start.index, by_block[a.id].index)  # the kernel waits for its block's start stamp
        assert end.deps == (by_block[a.id].index,)  # the end stamp waits for the kernel
        assert not any(end.index in n.deps for n in plan.nodes if n is not last)  # only the graph's end stamp waits
        # s depends on f alone: its span starts at f's end stamp, and no stamp sits on its path.
        assert block_pairs[s.id].start == block_pairs[f.id].end and block_pairs[f.id].start == 0
        f_end = next(n for n in ev if n.stamp == block_pairs[f.id].end)
        assert not any(f_end.index in n.deps for n in plan.nodes if n is not last)
        assert by_block[s.id].deps == (by_block[f.id].index,)
    if level.at_least(ProfilingLevel.PER_KERNEL):
        kernel_pairs = {p.key: p for p in plan.timings if p.kind == "kernel"}
        assert set(kernel_pairs) == {(b.id, 0) for b in (f, s, a, k)}
        for b in (f, s, a, k):  # single-kernel blocks: the kernel's span is the block's
            assert kernel_pairs[(b.id, 0)][2:] == block_pairs[b.id][2:]


def test_tooltip_formats() -> None:
    s = Scale(name="Emitter")
    assert str(s) == "Emitter: NotCompiled"
    s.debug.state = BlockState.OK
    assert str(s) == "Emitter: OK"
    s.debug.gpu_ms = 0.4234
    assert str(s) == "Emitter: OK, 0.42ms"
    s.debug.append_fill = {"Particles": (45231, 100000)}
    assert str(s) == "Emitter: OK, 0.42ms\n  Particles: 45231/100000"
    assert str(s.port("Out")) == "Out: float[?]"
    s.debug.sizes = {"Out": 1000}
    assert str(s.port("Out")) == "Out: float[1000], 4,000 bytes"
    from cudapatch import Shape

    s.debug.sizes, s.debug.shapes = {"Out": 1080 * 1920}, {"Out": Shape.of(1080, 1920)}
    assert str(s.port("Out")) == "Out: float 1080x1920, 8,294,400 bytes"
    k = AppendFilter(name="k")
    k.debug.append_fill = {"Kept": (3, 64)}
    assert str(k.port("Kept")) == "Kept: 3/64"
    with pytest.raises(CudapatchError, match="no such port"):
        s.port("Nope")
    s.debug.state, s.debug.message, s.debug.gpu_ms, s.debug.append_fill = BlockState.ERROR, "faulted", None, {}
    assert str(s) == "Emitter: Error: faulted"


def test_ring_takes_the_newest_completely_published_frame() -> None:
    from cudapatch.engine.readback import newest_published

    # Frame word per slot: written after the values; cleared a frame before the slot is rewritten.
    assert newest_published([0, 0, 0], 0) is None  # nothing published yet
    assert newest_published([0, 1, 0], 0) == 1  # frame 1 in slot 1; slot 2 cleared for frame 2
    assert newest_published([3, 1, 2], 0) == 0  # frame 3 (slot 0) is the newest
    assert newest_published([0, 4, 2], 0) == 1  # slot 0 cleared for frame 5: frame 4 is the newest
    assert newest_published([0, 1, 2], 0) == 2  # slot 0 cleared, frame 3 still being written
    assert newest_published([3, 1, 2], 3) is None  # nothing newer than what is held
    assert newest_published([3, 4, 2], 3) == 1


def test_publish_node_ends_graphs_with_readback_values() -> None:
    from cudapatch.blocks.library import AppendFilter
    from cudapatch.engine import Context
    from cudapatch.engine.context import ExternalBinding
    from cudapatch.engine.plan import PublishNodePlan

    ctx = Context()
    f = ctx.register_block(AppendFilter())
    ctx.bind_input(f, "In", ExternalBinding(0x1000, 64, f.description.input("In").dtype))
    for level in (ProfilingLevel.NONE, ProfilingLevel.PER_KERNEL):
        plan = compile_plan(ctx.snapshot(), level=level)
        last = plan.nodes[-1]
        assert isinstance(last, PublishNodePlan)
        used = {d for n in plan.nodes for d in n.deps}
        assert [n.index for n in plan.nodes if n.index not in used] == [last.index]  # the only sink
        assert "publish readback" in plan.describe()
    ctx2 = Context()
    s = ctx2.register_block(Scale())
    ctx2.bind_input(s, "In", ExternalBinding(0x1000, 64, s.description.input("In").dtype))
    assert not any(isinstance(n, PublishNodePlan) for n in compile_plan(ctx2.snapshot()).nodes)  # nothing to read


def test_the_publish_kernel_compiles_with_the_signature_realize_fills() -> None:
    from cudapatch.engine.engine import PUBLISH_KERNEL

    image = PUBLISH_KERNEL.compile("sm_90")  # NVRTC runs without a GPU
    params = image.descriptor.parameters
    assert [(p.name, p.is_pointer, p.dtype.itemsize) for p in params] == [
        ("src", True, 8),
        ("words", False, 4),
        ("ring", True, 8),
        ("slot_words", False, 4),
        ("frames", True, 8),
        ("end_stamp", False, 4),
    ]


@pytest.mark.parametrize("level", [ProfilingLevel.SUMMARY, ProfilingLevel.PER_BLOCK, ProfilingLevel.PER_KERNEL])
def test_profiling_nodes_hang_on_programmatic_edges(level: ProfilingLevel) -> None:
    from cudapatch.engine.plan import programmatic_edges

    c, _ = _patch()
    plan = compile_plan(c.snapshot(), level=level)
    nodes = plan.nodes
    edges = programmatic_edges(nodes)
    publish = nodes[-1]
    waited = {d for n in nodes if n is not publish for d in n.deps}
    for n in nodes:
        ports = edges.get(n.index, {})
        assert set(ports) <= set(n.deps)
        if isinstance(n, PublishNodePlan):  # launched early behind every kernel and stamp it waits for
            assert ports and set(ports) == {d for d in n.deps if isinstance(nodes[d], KernelNodePlan | StampNodePlan)}
            assert set(ports.values()) == {"programmatic"}
        elif isinstance(n, StampNodePlan) and n.deps and n.index not in waited:  # a stamp beside the work
            assert ports == {d: "programmatic" for d in n.deps if isinstance(nodes[d], KernelNodePlan)}
        elif isinstance(n, KernelNodePlan) and n.deps == (0,):  # a root: launched once the start stamp began
            assert ports == {0: "launch_order"}
        else:  # memsets, the start stamp, stamps the work waits for, kernels after other work
            assert not ports, (n, ports)
    assert any(isinstance(nodes[i], StampNodePlan) for i in edges) == level.at_least(ProfilingLevel.PER_BLOCK)
