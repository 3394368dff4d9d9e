"""Probes on wires, up to the plan: where the compiler places probe nodes and what they read, the
readback words they take, images and thumbnails, the probe API on the patch model, the records the ring
brings back decoded (``engine/probes.py``). The kernel itself runs in tests/gpu/test_probes_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import CustomKernel, Fill, Scale, VectorAdd
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.compiler.probes import image_shape
from cudapatch.engine.diagnostics import DiagnosticCode
from cudapatch.engine.plan import KernelNodePlan, ProbeNodePlan, PublishNodePlan, StampNodePlan, programmatic_edges
from cudapatch.engine.probes import (
    PROBE_BESIDE_BLOCKS,
    PROBE_KINDS,
    PROBE_MAX_BLOCKS,
    PROBE_WORDS,
    THUMB,
    ProbeSet,
    decode_probe,
    probe_grid,
    record_words,
)
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.engine.warm import Refusal, WarmRefusal, decide_warm_patch
from cudapatch.errors import LinkError
from cudapatch.kernels.types import DType
from tests.unit.plan_engine import PlanOnlyEngine
from tests.unit.test_lifecycle import doubles  # noqa: F401 - the fake driver, for the readback ring

from .unfused import compile_plan  # one node per block: these tests are about unfused plans

#: Writes its one pointer in place: a ``through`` output after the kernel.
BUMP = """\
extern "C" __global__ void bump(/*inout*/ float* data, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += 1.0f;
}
"""


def _chain(n: int = 3) -> tuple[Context, list]:
    c = Context()
    blocks = [c.register_block(Fill(name="fill"))]
    for i in range(1, n):
        blocks.append(c.register_block(Scale(name=f"s{i}")))
        c.connect(blocks[-2], "Out", blocks[-1], "In")
    return c, blocks


def _probes(plan) -> list[ProbeNodePlan]:
    return [n for n in plan.nodes if isinstance(n, ProbeNodePlan)]


def _kernel(plan, block) -> KernelNodePlan:
    (ni,) = plan.block_nodes[block.id]
    return plan.nodes[ni]


def test_a_patch_without_probes_plans_no_probe_and_no_readback():
    c, _ = _chain()
    plan = compile_plan(c.snapshot())
    assert not _probes(plan) and plan.probes == () and plan.probe_words == 0
    assert not any(isinstance(n, PublishNodePlan) for n in plan.nodes)


def test_a_probe_reads_the_wire_right_after_its_producer_and_the_graph_publishes_it():
    c, (fill, s1, s2) = _chain()
    key = c.add_probe(s1, "Out")
    plan = compile_plan(c.snapshot())
    (p,) = _probes(plan)
    assert key == (s1.id, "Out") and plan.probes == (key,)
    assert p.buffer == plan.outputs[(s1.id, "Out")]
    assert p.deps == (_kernel(plan, s1).index,)  # waits for the block that writes the buffer, nothing else
    assert p.index == _kernel(plan, s1).index + 1  # placed right after it
    assert p.values == plan.buffers[p.buffer].count and p.kind == PROBE_KINDS["float32"]
    assert p.offset == 0 and plan.probe_words == PROBE_WORDS and p.width == 0
    assert p.index not in _kernel(plan, s2).deps  # a side branch: the chain does not wait for it
    publish = plan.nodes[-1]
    assert isinstance(publish, PublishNodePlan) and p.index in publish.deps and publish.end_stamp is None
    assert programmatic_edges(plan.nodes)[p.index] == {_kernel(plan, s1).index: "programmatic"}


def test_probing_an_input_probes_the_output_linked_into_it():
    c, (fill, s1, s2) = _chain()
    assert c.add_probe(s2, "In") == (s1.id, "Out")
    assert c.probes == {(s1.id, "Out"): None}


def test_unknown_ports_unlinked_inputs_and_foreign_blocks_are_refused():
    c, (fill, s1, s2) = _chain()
    with pytest.raises(LinkError, match="unknown port"):
        c.add_probe(s1, "Nope")
    lonely = c.register_block(Scale(name="lonely"))
    with pytest.raises(LinkError, match="no link feeds"):
        c.add_probe(lonely, "In")
    other = Context()
    stranger = other.register_block(Scale(name="stranger"))
    with pytest.raises(LinkError):
        c.add_probe(stranger, "Out")
    assert c.probes == {}


def test_adding_and_removing_a_probe_is_a_structure_edit_and_a_removed_block_takes_its_probes():
    c, (fill, s1, s2) = _chain()
    c.dirty.clear_structure()
    c.add_probe(s1, "Out")
    assert c.dirty.structure
    c.dirty.clear_structure()
    c.add_probe(s1, "Out")  # already probed: nothing to build
    assert not c.dirty.structure
    assert c.remove_probe((s1.id, "Out")) and c.dirty.structure
    assert not c.remove_probe((s1.id, "Out"))
    c.add_probe(s2, "Out", (4, 256))
    c.dirty.clear_structure()
    c.add_probe(s2, "Out")  # probed again without a shape (a selected wire): the image stays
    assert c.probes == {(s2.id, "Out"): (4, 256)} and not c.dirty.structure
    c.unregister_block(s2)
    assert c.probes == {} and compile_plan(c.snapshot()).probes == ()


def test_an_in_place_writer_after_the_probe_waits_for_it():
    c, (fill, s1) = _chain(2)
    bump = c.register_block(CustomKernel(name="bump", Code=BUMP))
    c.connect(s1, "Out", bump, "data")
    c.add_probe(s1, "Out")
    c.add_probe(bump, "data")  # the through output: the same buffer after the in-place write
    plan = compile_plan(c.snapshot())
    first, second = _probes(plan)
    k = _kernel(plan, bump)
    assert first.buffer == second.buffer == plan.outputs[(s1.id, "Out")]
    assert first.index in k.deps  # write after read: the wire's value is read before bump changes it
    assert second.deps == (k.index,)
    assert (second.offset, plan.probe_words) == (PROBE_WORDS, 2 * PROBE_WORDS)


def test_a_through_port_carrying_bound_memory_is_not_probed_and_says_why():
    c = Context()
    bump = c.register_block(CustomKernel(name="bump", Code=BUMP))
    c.bind_input(bump, "data", ExternalBinding(0x7000_0000, 64, DType.FLOAT32))
    c.add_probe(bump, "data")
    plan = compile_plan(c.snapshot())
    assert not _probes(plan)
    (d,) = [d for d in plan.diagnostics if d.code == "probe"]
    assert d.block_id == bump.id and "bound from outside" in d.message
    assert d.code is DiagnosticCode.PROBE  # one of the engine's codes, not a plain string a host must guess


def test_probes_of_a_block_that_is_not_running_are_left_out():
    c = Context()
    s = c.register_block(Scale(name="s"))  # its input is unlinked: the block does not run
    add = c.register_block(VectorAdd(name="add"))
    c.connect(s, "Out", add, "A")
    c.add_probe(s, "Out")
    plan = compile_plan(c.snapshot())
    assert not _probes(plan) and plan.probe_words == 0


def test_profiling_stamps_measure_the_block_without_its_probe_and_publish_waits_for_it():
    c, (fill, s1, s2) = _chain()
    c.add_probe(s1, "Out")
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    (p,) = _probes(plan)
    k = _kernel(plan, s1)
    end = next(t.end for t in plan.timings if t.kind == "block" and t.key == s1.id)
    (stamp,) = [n for n in plan.nodes if isinstance(n, StampNodePlan) and n.stamp == end]
    assert stamp.deps == (k.index,)  # the block's end stamp does not wait for the probe
    publish = plan.nodes[-1]
    assert p.index in publish.deps
    edges = programmatic_edges(plan.nodes)
    assert edges[publish.index][p.index] == "programmatic"  # publish waits for it inside
    assert edges[p.index] == {k.index: "programmatic"}  # and so does the probe for its producer


def test_a_new_probe_needs_a_new_graph_and_an_unchanged_one_patches_warm():
    c, (fill, s1, s2) = _chain()
    old = compile_plan(c.snapshot())
    c.add_probe(s1, "Out")
    new = compile_plan(c.snapshot())
    caps = [b.count * b.dtype.itemsize for b in old.buffers]
    refusal = decide_warm_patch(old, new, {}, capacities=caps)
    assert isinstance(refusal, WarmRefusal) and refusal.reason is Refusal.NODE_COUNT
    again = compile_plan(c.snapshot())
    assert not isinstance(decide_warm_patch(new, again, {}, capacities=caps), WarmRefusal)


def test_probe_grid_grows_with_the_values_up_to_its_limit():
    assert probe_grid(0) == probe_grid(1) == probe_grid(2048) == 1
    assert probe_grid(2049) == 2
    assert probe_grid(10**9) == PROBE_MAX_BLOCKS
    assert probe_grid(10**9, beside=True) == PROBE_BESIDE_BLOCKS < PROBE_MAX_BLOCKS  # leaves SMs to the readers
    assert probe_grid(2049, beside=True) == 2


@pytest.mark.parametrize(
    ("values", "given", "params", "want"),
    [
        (64 * 32, (32, 64), [], (32, 64, 1)),
        (64 * 32 * 4, (32, 64), [], (32, 64, 4)),
        (64 * 32 * 5, (32, 64), [], None),  # five channels: not an image
        (1000, (32, 64), [], None),  # does not divide
        (640 * 480 * 4, None, [{"Factor": 2.0}, {"Width": 640, "Height": 480}], (480, 640, 4)),  # a reader says
        (640 * 480, None, [{"Width": 640, "Height": 480}], (480, 640, 1)),  # the producer says
        (640 * 480, None, [{"Width": 3, "Height": 3}, {"Width": 640, "Height": 480}], (480, 640, 1)),
        (640 * 480, None, [{"Width": 640.0, "Height": 480}], None),  # not integers
        (100, None, [], None),
    ],
)
def test_image_shape_from_the_probe_or_the_width_and_height_of_the_blocks_around_the_wire(values, given, params, want):
    assert image_shape(values, given, params) == want


def test_an_image_probe_carries_its_thumbnail_size_and_takes_its_words():
    c = Context()
    fill = c.register_block(Fill(name="fill", Count=640 * 480))
    tiny = c.register_block(Fill(name="tiny", Count=15))
    c.add_probe(fill, "Out", (480, 640))
    c.add_probe(tiny, "Out", (3, 5))  # the thumbnail is the image's size
    plan = compile_plan(c.snapshot())
    big, small = _probes(plan)
    assert (big.width, big.height, big.channels, big.thumb_w, big.thumb_h) == (640, 480, 1, THUMB, THUMB)
    assert (small.width, small.height, small.thumb_w, small.thumb_h) == (5, 3, 5, 3)
    assert small.offset == record_words(THUMB, THUMB) == PROBE_WORDS + THUMB * THUMB // 8
    assert plan.probe_words == record_words(THUMB, THUMB) + record_words(5, 3)


def _record(data: np.ndarray, thumb: np.ndarray | None = None) -> np.ndarray:
    """The words the probe kernel writes for ``data`` (its float64 arithmetic, done by NumPy)."""
    v = data.astype(np.float64).ravel()
    fin = v[np.isfinite(v)]
    w = np.zeros(record_words(*(thumb.shape[::-1] if thumb is not None else (0, 0))), np.uint64)
    head = np.array([fin.min() if fin.size else np.inf, fin.max() if fin.size else -np.inf, fin.sum()], np.float64)
    w[:3] = head.view(np.uint64)
    w[3:8] = [fin.size, np.isnan(v).sum(), np.isposinf(v).sum(), np.isneginf(v).sum(), v.size]
    if thumb is not None:
        w[PROBE_WORDS:].view(np.uint8)[: thumb.size] = thumb.ravel()
    return w


def test_a_record_decodes_to_the_statistics_of_the_finite_values():
    rng = np.random.default_rng(7)
    data = rng.normal(3.0, 2.0, 1000).astype(np.float32)
    data[[5, 17]] = np.nan
    data[99], data[100] = np.inf, -np.inf
    st = decode_probe(_record(data), frame=41, age=2)
    fin = data[np.isfinite(data)].astype(np.float64)
    assert (st.frame, st.age, st.values, st.nan, st.inf, st.finite) == (41, 2, 1000, 2, 2, 996)
    assert st.minimum == fin.min() and st.maximum == fin.max() and st.mean == pytest.approx(fin.mean(), rel=1e-12)
    assert st.bad and st.thumbnail is None
    assert "NaN 2" in str(st) and "frame 41" in str(st)


def test_a_record_with_no_finite_value_has_no_span_and_a_thumbnail_comes_back_shaped():
    data = np.full(12, np.nan, np.float32)
    thumb = np.arange(12, dtype=np.uint8).reshape(3, 4)
    st = decode_probe(_record(data, thumb), frame=3, age=1, thumb=(4, 3))
    assert st.minimum is st.maximum is st.mean is None and st.nan == 12
    np.testing.assert_array_equal(st.thumbnail, thumb)
    assert "no finite value" in str(st)


def test_the_probe_set_gives_one_handle_per_output_and_closing_it_removes_the_probe():
    engine = PlanOnlyEngine()
    c = engine.context
    fill = engine.add(Fill(name="fill"))
    s = engine.add(Scale(name="s"))
    engine.connect(fill, "Out", s, "In")
    p = engine.probe(s, "In")
    assert p is engine.probe(fill, "Out") and p.block is fill and p.port == "Out"
    assert p.stats is None and not p.running  # no graph runs here
    engine.update()
    assert engine.plan.probes == ((fill.id, "Out"),)
    p.close()
    p.close()
    assert p.is_closed and c.probes == {}
    engine.update()
    assert engine.plan.probes == ()
    q = engine.probe(fill, "Out")
    assert q is not p and len(engine._probes) == 1
    engine.remove(fill)  # the block takes its probe along; the handle is left, reading None
    assert len(engine._probes) == 0 and list(engine._probes) == [] and q.stats is None


def test_the_probe_set_reads_stats_from_the_running_graph():
    class Graph:  # what ProbeSet reads of a CompiledGraph
        plan = compile_plan(_chain()[0].snapshot())

        def probe_stats(self, key):
            return ("stats of", key)

    c, (fill, s1, s2) = _chain()
    g = Graph()
    probes = ProbeSet(c, lambda: g)
    p = probes.add(s1, "Out")
    assert p.stats == ("stats of", (s1.id, "Out")) and len(probes) == 1


def test_the_readback_ring_brings_probe_records_back_after_the_counters(doubles):  # noqa: F811 - the fixture
    from cudapatch.engine.readback import ReadbackRing

    data = np.array([1.5, -2.0, np.nan, 4.0], np.float32)
    record = _record(data)
    ring = ReadbackRing(0xD000, 3, stamps=2, frames_ptr=0xD100, probe_words=len(record))
    try:
        assert ring.words == 2 + 2 + len(record)  # 3 uint32 counters take 2 words
        # What the publish kernel writes for the graph's first frame: stamps, counters, probe records.
        values = np.zeros(ring.words, np.uint64)
        values[:2] = [111, 222]
        values[2:4].view(np.uint32)[:3] = [7, 8, 9]
        values[4:] = record
        slot = ring._ring[1 % 3]
        slot[2 : 2 + ring.words] = values
        slot[1] = 1
        ring.record(0)
        assert ring.poll()
        assert list(ring.latest_stamps) == [111, 222] and list(ring.latest) == [7, 8, 9]
        st = decode_probe(ring.latest_probes, frame=ring.latest_frame, age=1)
        assert (st.minimum, st.maximum, st.nan, st.values, st.frame) == (-2.0, 4.0, 1, 4, 0)
    finally:
        ring.close()


def test_a_probed_wire_is_not_fused_away_and_a_fused_groups_output_is_probed_after_its_node():
    c, (fill, s1, s2, s3) = _chain(4)
    c.add_probe(s1, "Out")  # s1 -> s2 would fuse; the probe reads s1's value, so it keeps its buffer
    plan = compile_plan(c.snapshot(), fuse=True)
    (p,) = _probes(plan)
    assert p.buffer == plan.outputs[(s1.id, "Out")] and plan.buffers[p.buffer].count == 1024
    assert plan.block_nodes[s2.id] == plan.block_nodes[s3.id]  # s2 and s3 still fuse
    c.remove_probe((s1.id, "Out"))
    c.add_probe(s3, "Out")  # the group's output
    plan = compile_plan(c.snapshot(), fuse=True)
    (p,) = _probes(plan)
    (fused,) = set(plan.block_nodes[s1.id]) | set(plan.block_nodes[s3.id])
    assert p.deps == (fused,) and p.buffer == plan.outputs[(s3.id, "Out")]
