"""The compiler's phases one at a time: each test runs the phases before the one it checks on a
small patch, then looks at exactly what that phase added to the PlanDraft."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from cudapatch import AppendFilter, Fill, Scale, VectorAdd, computed, fixed, from_param, like
from cudapatch.blocks.library import FFT, GEMM, Emitter, Forces, ToPoints
from cudapatch.engine import Context, ExternalBinding, Link, PatchSnapshot
from cudapatch.engine.compiler import (
    PlanDraft,
    compile_plan,
    edges,
    memory,
    nodes,
    order,
    publish,
    sizes,
    stamps,
    validate,
)
from cudapatch.engine.compiler.draft import NodeDraft, Source, resolve_count
from cudapatch.engine.compiler.order import RANKS_PER_CALL, _ranked_above, topological_order
from cudapatch.engine.compiler.shapes import flat
from cudapatch.engine.compiler.stamps import place_stamps
from cudapatch.engine.plan import (
    BufferPlan,
    CapturedNodePlan,
    KernelNodePlan,
    MemsetNodePlan,
    PublishNodePlan,
    StampNodePlan,
    TimingPair,
)
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.errors import GraphCompileError
from cudapatch.kernels.types import DType
from tests.unit.test_compiler import TwoStage
from tests.unit.test_compiler_golden import NumbaSaxpy, ScaleThenAdd

Phase = Callable[[PlanDraft], None]
PIPELINE: tuple[Phase, ...] = (validate, order, sizes, memory, nodes, edges, stamps, publish)


def _upto(phase: Phase, snap: PatchSnapshot, **kw) -> PlanDraft:
    """A draft after every phase before ``phase`` (``phase`` itself is left for the test to run)."""
    draft = PlanDraft(snap, **kw)
    for p in PIPELINE[: PIPELINE.index(phase)]:
        p(draft)
    return draft


def _ctx(*blocks) -> Context:
    c = Context()
    for b in blocks:
        c.register_block(b)
    return c


def _bind(c: Context, block, port: str, count: int, ptr: int = 0x7000_0000) -> None:
    c.bind_input(block, port, ExternalBinding(ptr, count, block.description.input(port).dtype))


def _chain() -> tuple[Context, Fill, Scale, Scale]:
    f, s1, s2 = Fill(name="f", Count=1000), Scale(name="s1", Factor=2.0), Scale(name="s2")
    c = _ctx(f, s1, s2)
    c.connect(f, "Out", s1, "In")
    c.connect(s1, "Out", s2, "In")
    return c, f, s1, s2


# -- validate ---------------------------------------------------------------------------------------
def test_validate_keeps_the_good_links_and_indexes_each_linked_input() -> None:
    c, f, s1, s2 = _chain()
    draft = PlanDraft(c.snapshot())
    validate(draft)
    assert not draft.errors and draft.links == list(c.snapshot().links)
    assert draft.incoming == {(s1.id, "In"): draft.links[0], (s2.id, "In"): draft.links[1]}


def test_validate_records_every_bad_link_and_drops_only_those() -> None:
    c, f, s1, s2 = _chain()
    e = c.register_block(Emitter(name="e"))
    snap = c.snapshot()
    good = snap.links[0]
    bad = (
        Link(f.id, "Nope", s2.id, "In"),  # unknown output
        Link(f.id, "Out", s2.id, "Nope"),  # unknown input
        Link(e.id, "Particles", s2.id, "In"),  # float4 -> float
        Link(f.id, "Out", s1.id, "In"),  # s1.In is linked already
        Link(99_999, "Out", s2.id, "In"),  # another engine's block
    )
    foreign = dataclasses.replace(snap.blocks[2], context_id=-1)
    snap = dataclasses.replace(snap, blocks=(*snap.blocks[:2], foreign, *snap.blocks[3:]), links=(good, *bad))
    draft = PlanDraft(snap)
    validate(draft)
    assert [(d.block_id, d.code) for d in draft.errors] == [
        (s2.id, "cross-engine"),
        (f.id, "unknown-port"),
        (s2.id, "unknown-port"),
        (s2.id, "type-mismatch"),
        (s1.id, "duplicate-link"),
        (s2.id, "cross-engine"),
    ]
    assert draft.links == [good] and list(draft.incoming) == [(s1.id, "In")]
    with pytest.raises(GraphCompileError, match=r"^6 error\(s\) in the patch: block 's2' belongs") as info:
        draft.raise_errors()
    assert info.value.diagnostics == tuple(draft.errors)


# -- order ------------------------------------------------------------------------------------------
def test_topological_order_breaks_ties_by_position() -> None:
    links = [Link(30, "o", 10, "i"), Link(20, "o", 10, "i"), Link(40, "o", 20, "i")]
    assert topological_order([10, 20, 30, 40], links) == ([30, 40, 20, 10], [])
    assert topological_order([40, 30, 20, 10], links) == ([40, 30, 20, 10], [])
    assert topological_order([], []) == ([], [])


def test_topological_order_reports_blocks_on_and_behind_a_cycle() -> None:
    links = [Link(1, "o", 2, "i"), Link(2, "o", 3, "i"), Link(3, "o", 2, "i"), Link(3, "o", 4, "i")]
    assert topological_order([1, 2, 3, 4, 5], links) == ([1, 5], [2, 3, 4])


def test_relinked_is_the_symmetric_difference_of_the_links_with_or_without_the_touched_keys() -> None:
    import random

    from cudapatch.engine.compiler.validate import relinked

    rng = random.Random(5)
    for _ in range(100):
        old = {(d, "In"): Link(rng.randrange(50), "Out", d, "In") for d in rng.sample(range(60), 30)}
        new = dict(old)
        touched = []
        for _ in range(rng.randrange(6)):
            d = rng.randrange(60)
            key = (d, "In")
            touched.append(key)
            what = rng.random()
            if what < 0.3:
                new.pop(key, None)
            elif what < 0.6 and key in new:  # an equal link, another object: no change
                lk = new[key]
                new[key] = Link(lk.src, lk.src_port, lk.dst, lk.dst_port)
            else:
                new[key] = Link(rng.randrange(50), "Out", d, "In")
        want = set(new.items() ^ old.items())
        assert set(relinked(new, old)) == want and len(relinked(new, old)) == len(want)
        assert set(relinked(new, old, touched + touched[:1])) == want
        assert len(relinked(new, old, touched)) == len(want)


def test_ranked_above_looks_over_long_orders_in_slices_as_one_max_would() -> None:
    import random

    rng = random.Random(3)
    order = list(range(3 * RANKS_PER_CALL + 17))
    rng.shuffle(order)
    rank = {b: rng.randrange(10**6) for b in order}
    for _ in range(200):
        lo = rng.randrange(len(order))
        hi = rng.randrange(lo + 1, len(order) + 1)
        r = rng.choice([rank[order[rng.randrange(lo, hi)]], rng.randrange(10**6)])
        assert _ranked_above(rank, order, lo, hi, r) == (max(rank[b] for b in order[lo:hi]) > r)


def test_order_fills_the_order_and_records_a_cycle_error_per_block() -> None:
    c, f, s1, s2 = _chain()
    snap = c.snapshot()
    draft = _upto(order, snap)
    order(draft)
    assert draft.order == [f.id, s1.id, s2.id] and not draft.errors
    cyc = dataclasses.replace(snap, links=(*snap.links[1:], Link(s2.id, "Out", s1.id, "In")))
    draft = _upto(order, cyc)
    order(draft)
    assert draft.order == [f.id]
    assert [(d.block_id, d.code) for d in draft.errors] == [(s1.id, "cycle"), (s2.id, "cycle")]
    assert "part of a cycle ('s1' -> 's2' -> 's1')" in draft.errors[0].message


# -- sizes ------------------------------------------------------------------------------------------
def test_resolve_count_covers_every_rule() -> None:
    inputs = {"A": Source("external", (1, "A"), 100, flat(100))}
    values = {"N": 7, "M": 3}
    assert resolve_count(like("A"), inputs, values) == 100
    assert resolve_count(like("A", 3, divide=2, extra=1), inputs, values) == 151  # 100 // 2 * 3 + 1
    assert resolve_count(from_param("N", 4, 2), inputs, values) == 30
    assert resolve_count(fixed(12), inputs, values) == 12
    assert resolve_count(like("A", extra=-1000), inputs, values) == 0  # never negative
    assert resolve_count(computed(lambda n, v: n + v["N"] * v["M"], "N", "M", like="A"), inputs, values) == 121
    assert resolve_count(computed(lambda n, v: v["N"] if n is None else -1, "N"), inputs, values) == 7


def test_sizes_follow_links_bindings_and_size_rules() -> None:
    f, s, add, two = Fill(name="f", Count=300), Scale(name="s"), VectorAdd(name="add"), TwoStage(name="two")
    c = _ctx(f, s, add, two)
    c.connect(f, "Out", s, "In")
    c.connect(s, "Out", add, "A")
    _bind(c, add, "B", 300)
    _bind(c, two, "In", 64)
    draft = _upto(sizes, c.snapshot())
    sizes(draft)
    assert list(draft.sized) == [f.id, s.id, add.id, two.id] and not draft.skipped and not draft.warnings
    assert draft.values == [  # each value as the buffer it needs on its own
        BufferPlan(0, f.id, "Out", DType.FLOAT32, 300, False),
        BufferPlan(1, s.id, "Out", DType.FLOAT32, 300, False),
        BufferPlan(2, add.id, "Sum", DType.FLOAT32, 300, False),
        BufferPlan(3, two.id, "Out", DType.FLOAT32, 64, False),
        BufferPlan(4, two.id, "internal0", DType.FLOAT32, 64, False),
    ]
    assert draft.sized[f.id].outputs == {"Out": Source("value", 0, 300, flat(300))}
    assert draft.sized[f.id].made == range(0, 1)
    assert draft.sized[s.id].inputs == {"In": Source("value", 0, 300, flat(300))}
    assert draft.sized[add.id].inputs["B"] == Source("external", (add.id, "B"), 300, flat(300))
    assert draft.sized[two.id].internal == (4,) and draft.sized[two.id].made == range(3, 5)
    assert draft.ports == {(f.id, "Out"): 0, (s.id, "Out"): 1, (add.id, "Sum"): 2, (two.id, "Out"): 3}
    assert draft.binding_counts == {(add.id, "B"): 300, (two.id, "In"): 64}


def test_sizes_pass_a_through_port_its_input_value() -> None:
    c = Context()
    e, fo, t = (c.register_block(b) for b in (Emitter(name="e", Capacity=10), Forces(name="fo"), ToPoints(name="t")))
    c.connect(e, "Particles", fo, "Particles")
    c.connect(fo, "Particles", t, "Particles")
    draft = _upto(sizes, c.snapshot())
    sizes(draft)
    state = draft.sized[e.id].outputs["Particles"]
    assert state == Source("value", 0, 4 * 10 + 2, flat(4 * 10 + 2)) and draft.values[0].dtype is DType.FLOAT4
    assert draft.sized[fo.id].outputs["Particles"] is state and draft.sized[t.id].inputs["Particles"] is state
    assert draft.sized[fo.id].made == range(1, 1)  # a through port makes no value
    assert draft.ports == {(e.id, "Particles"): 0, (fo.id, "Particles"): 0, (t.id, "Points"): 1}


def test_sizes_leave_out_blocks_and_say_why() -> None:
    lone, after = Scale(name="lone"), Scale(name="after")  # unlinked, then downstream of it
    f, waiting, gemm = Fill(name="f"), Scale(name="waiting"), GEMM(name="gemm", M=2, N=2, K=2)
    fft = FFT(name="fft", Nx=8)
    c = _ctx(lone, after, f, waiting, gemm, fft)
    c.connect(lone, "Out", after, "In")
    c.connect(f, "Out", waiting, "In")
    _bind(c, gemm, "A", 4)
    _bind(c, gemm, "B", 5)  # a 2x2 matrix has 4 elements
    _bind(c, fft, "In", 16)
    status = {(waiting.id, 0): ("info", "kernel-compiling", "compiling 'scale'")}
    draft = _upto(sizes, c.snapshot(), kernel_status=status)
    sizes(draft)
    assert draft.skipped == [lone.id, after.id, waiting.id, gemm.id] and list(draft.sized) == [f.id, fft.id]
    found = {d.block_id: (d.severity, d.code, d.message) for d in draft.warnings}
    assert found[lone.id] == (
        "warning",
        "input-unlinked",
        "block 'lone' is not running: required input 'In' is not linked",
    )
    assert found[after.id][1] == "input-not-running"
    assert found[after.id][2].endswith("input 'In' comes from 'lone', which is not running")
    assert found[waiting.id] == ("info", "kernel-compiling", "block 'waiting' is not running: compiling 'scale'")
    assert found[gemm.id][:2] == ("error", "library-shape") and "input 'B' has 5 elements" in found[gemm.id][2]
    assert draft.binding_counts == {(gemm.id, "A"): 4, (gemm.id, "B"): 5, (fft.id, "In"): 16}


def test_sizes_warn_the_readers_of_a_faulted_block() -> None:
    c, f, s1, s2 = _chain()
    draft = _upto(sizes, c.snapshot(), faulted={s1.id: "illegal address"})
    sizes(draft)
    assert list(draft.sized) == [f.id, s1.id, s2.id]  # a faulted block still "runs": it makes zeros
    ((block, code, message),) = [(d.block_id, d.code, d.message) for d in draft.warnings]
    assert (block, code) == (
        s2.id,
        "input-faulted",
    ) and message == "input 'In' of 's2' reads zeros: 's1' faulted on the GPU"


# -- memory ---------------------------------------------------------------------------------------
def test_memory_gives_each_value_a_buffer_and_each_append_output_a_counter() -> None:
    f, k, two, s = Fill(name="f", Count=50), AppendFilter(name="k", Capacity=8), TwoStage(name="two"), Scale(name="s")
    c = _ctx(f, k, two, s)
    c.connect(f, "Out", k, "In")
    c.connect(f, "Out", two, "In")
    c.connect(k, "Kept", s, "In")
    draft = _upto(memory, c.snapshot())
    memory(draft)
    assert [(b.index, b.block_id, b.label, b.count, b.append) for b in draft.buffers] == [
        (0, f.id, "Out", 50, False),
        (1, k.id, "Kept", 8, True),
        (2, two.id, "Out", 50, False),
        (3, two.id, "internal0", 50, False),
        (4, s.id, "Out", 8, False),
    ]
    assert draft.buffers == draft.values and draft.value_buffer == [0, 1, 2, 3, 4]
    assert draft.counters == [(k.id, "Kept")] and draft.appends == {(k.id, "Kept"): (1, 0)}
    assert draft.value_counter == {1: 0}
    assert draft.outputs == {(f.id, "Out"): 0, (k.id, "Kept"): 1, (two.id, "Out"): 2, (s.id, "Out"): 4}


def test_memory_maps_a_through_port_to_the_buffer_it_modifies() -> None:
    c = Context()
    e, fo = c.register_block(Emitter(name="e")), c.register_block(Forces(name="fo"))
    c.connect(e, "Particles", fo, "Particles")
    draft = _upto(memory, c.snapshot())
    memory(draft)
    assert len(draft.buffers) == 1 and draft.buffers[0].dtype is DType.FLOAT4
    assert draft.outputs == {(e.id, "Particles"): 0, (fo.id, "Particles"): 0}


def test_memory_leaves_an_external_value_out_of_the_buffers() -> None:
    fo = Forces(name="fo")  # modifies a bound buffer in place: nothing to allocate, no output buffer
    c = _ctx(fo)
    _bind(c, fo, "Particles", 42)
    draft = _upto(memory, c.snapshot())
    memory(draft)
    assert draft.buffers == [] and draft.outputs == {}


# -- nodes ------------------------------------------------------------------------------------------
def test_nodes_give_every_argument_its_source_and_record_patchable_slots() -> None:
    s, add = Scale(name="s", Factor=3.0), VectorAdd(name="add")
    c = _ctx(s, add)
    _bind(c, s, "In", 600)
    c.connect(s, "Out", add, "A")
    _bind(c, add, "B", 600, 0x9000)
    draft = _upto(nodes, c.snapshot())
    nodes(draft)
    ns, na = draft.drafts
    assert ns.cls is KernelNodePlan and ns.head[:3] == (0, s.id, 0) and ns.head[5] == 3  # grid: ceil(600 / 256)
    args = ns.head[8]
    assert [(a.kind, a.ref, a.value) for a in args] == [
        ("external", (s.id, "In"), None),
        ("buffer", 0, None),
        ("scalar", (s.id, "Factor"), 3.0),
        ("scalar", (s.id, "Offset"), 0.0),
        ("const", None, 600),
    ]
    assert (ns.reads, ns.writes) == ([(s.id, "In")], [0])
    assert (na.reads, na.writes) == ([0, (add.id, "B")], [1])
    assert draft.scalar_slots == {(s.id, "Factor"): ((0, 2),), (s.id, "Offset"): ((0, 3),)}
    assert draft.binding_slots == {(s.id, "In"): ((0, 0),), (add.id, "B"): ((1, 1),)}
    assert draft.block_nodes == {s.id: (0,), add.id: (1,)} and not draft.nodes  # no dependencies yet


def test_nodes_put_the_counter_memset_first_and_mark_its_users() -> None:
    f, k = Fill(name="f"), AppendFilter(name="k")
    c = _ctx(f, k)
    c.connect(f, "Out", k, "In")
    draft = _upto(nodes, c.snapshot())
    nodes(draft)
    memset, nf, nk = draft.drafts
    assert (memset.cls, memset.head, memset.tail) == (MemsetNodePlan, (0, 1), (None,))
    assert draft.counter_users == {nk.head[0]} and nk.head[0] == 2
    counter = nk.head[8][2]
    assert (counter.kind, counter.ref) == ("counter", 0) and -1 in nk.reads and -1 in nk.writes
    assert draft.block_nodes == {f.id: (1,), k.id: (2,)}


def test_nodes_replace_a_faulted_block_by_zero_fills_of_its_buffers() -> None:
    f, two = Fill(name="f"), TwoStage(name="two")
    c = _ctx(f, two)
    c.connect(f, "Out", two, "In")
    draft = _upto(nodes, c.snapshot(), faulted={two.id: "misaligned"})
    nodes(draft)
    _, zero_out, zero_internal = draft.drafts
    assert [(z.cls, z.head, z.tail, z.writes) for z in (zero_out, zero_internal)] == [
        (MemsetNodePlan, (1, 0), (1,), [1]),
        (MemsetNodePlan, (2, 0), (2,), [2]),
    ]
    assert two.id not in draft.block_nodes and not any(k[0] == two.id for k in draft.scalar_slots)


def test_nodes_expand_numba_arrays_into_their_abi_slots() -> None:
    nb = NumbaSaxpy(name="nb")
    c = _ctx(nb)
    _bind(c, nb, "X", 40)
    draft = _upto(nodes, c.snapshot())
    nodes(draft)
    (n,) = draft.drafts
    args = n.head[8]
    assert len(args) == 3 * 7 + 2
    out, x, y = args[0:7], args[7:14], args[14:21]
    assert [a.value for a in out if a.kind == "const"] == [
        0,
        0,
        40,
        4,
        40,
        4,
    ]  # meminfo parent nitems itemsize shape0 stride0
    assert out[4].kind == "buffer" and x[4].kind == "external" and y[4].kind == "null"
    assert [a.value for a in y if a.kind == "const"] == [0, 0, 0, 4, 0, 4]  # an unbound optional array is empty
    assert draft.binding_slots == {(nb.id, "X"): ((0, 11),)}  # the data pointer's slot
    assert draft.scalar_slots == {(nb.id, "A"): ((0, 21),)} and args[22].value == 40


def test_nodes_make_a_captured_node_for_a_library_call() -> None:
    g = GEMM(name="g", M=2, N=3, K=4)
    c = _ctx(g)
    _bind(c, g, "A", 8)
    _bind(c, g, "B", 12)
    draft = _upto(nodes, c.snapshot())
    nodes(draft)
    (n,) = draft.drafts
    assert n.cls is CapturedNodePlan and n.head[:3] == (0, g.id, 0) and n.head[3] is g.description.kernels[0]
    assert n.reads == [(g.id, "A"), (g.id, "B"), 0] and n.writes == [0]  # C is in/out: C = alpha A B + beta C
    assert [(a.kind, a.value) for a in n.head[5][3:6]] == [("scalar", 2), ("scalar", 3), ("scalar", 4)]


# -- edges ------------------------------------------------------------------------------------------
def _edges_of(*accesses: tuple[list, list], counter_users: set[int] = frozenset()) -> list[tuple[int, ...]]:
    draft = PlanDraft(PatchSnapshot(0, (), (), {}))
    draft.drafts = [_new_draft(i, reads, writes) for i, (reads, writes) in enumerate(accesses)]
    draft.counter_users = set(counter_users)
    edges(draft)
    assert [n.index for n in draft.nodes] == list(range(len(accesses)))
    return [n.deps for n in draft.nodes]


def _new_draft(index: int, reads: list, writes: list) -> NodeDraft:
    return NodeDraft(MemsetNodePlan, (index, 0), (None,), reads, writes)


def test_edges_order_writers_and_readers_of_each_resource() -> None:
    A, B, X = 0, 1, (7, "In")  # two buffers and an external binding
    deps = _edges_of(
        ([], [A]),  # 0 writes A
        ([A], [B]),  # 1 reads A (after 0), writes B
        ([A], []),  # 2 reads A: after 0 only, parallel to 1
        ([X], [A]),  # 3 rewrites A: after its writer and both readers
        ([X], []),  # 4 reads X: nobody wrote it
        ([A, B], [A]),  # 5 in place on A, reads B: after 3 (A) and 1 (B)
        ([], [B]),  # 6 rewrites B: after 1 (writer) and 5 (reader)
    )
    assert deps == [(), (0,), (0,), (0, 1, 2), (), (1, 3), (1, 5)]


def test_edges_make_counter_users_wait_for_the_counter_memset() -> None:
    deps = _edges_of(([], []), ([], [2]), ([2, -1], [-1]), ([-1], [-1]), counter_users={2, 3})
    assert deps == [(), (), (0, 1), (0, 2)]  # 2 reads what 1 wrote; both users wait for the memset


def test_edges_finish_nodes_of_every_kind() -> None:
    c, f, s1, s2 = _chain()
    draft = _upto(edges, c.snapshot())
    edges(draft)
    assert [type(n) for n in draft.nodes] == [KernelNodePlan] * 3
    assert [n.deps for n in draft.nodes] == [(), (0,), (1,)]
    assert [n[:-2] for n in draft.nodes] == [d.head for d in draft.drafts]  # all but deps and yz


# -- stamps and publish -----------------------------------------------------------------------------
def _profiled() -> tuple[Context, list]:
    f, s, mix = Fill(name="f", Count=512), Scale(name="s"), ScaleThenAdd(name="mix")
    c = _ctx(f, s, mix)
    c.connect(f, "Out", s, "In")
    c.connect(f, "Out", mix, "A")
    c.connect(s, "Out", mix, "B")
    return c, [f, s, mix]


def test_stamps_do_nothing_without_profiling() -> None:
    c, _ = _profiled()
    draft = _upto(stamps, c.snapshot())
    before = list(draft.nodes), dict(draft.scalar_slots)
    stamps(draft)
    assert (draft.nodes, draft.scalar_slots) == before and draft.stamp_count == 0 and draft.timings == ()


@pytest.mark.parametrize("level", [ProfilingLevel.SUMMARY, ProfilingLevel.PER_BLOCK, ProfilingLevel.PER_KERNEL])
def test_stamps_renumber_nodes_slots_and_block_lists_together(level: ProfilingLevel) -> None:
    c, blocks = _profiled()
    draft = _upto(stamps, c.snapshot(), level=level)
    work = {(n.block_id, n.kernel): n for n in draft.nodes}
    slots = {k: [(_work_key(draft.nodes[ni]), ai) for ni, ai in v] for k, v in draft.scalar_slots.items()}
    stamps(draft)
    assert isinstance(draft.nodes[0], StampNodePlan) and draft.nodes[0].stamp == 0
    assert [n.index for n in draft.nodes] == list(range(len(draft.nodes)))
    assert all(d < n.index for n in draft.nodes for d in n.deps)
    assert {k: [(_work_key(draft.nodes[ni]), ai) for ni, ai in v] for k, v in draft.scalar_slots.items()} == slots
    for b in blocks:  # each block's list names its own nodes, in order
        assert [_work_key(draft.nodes[i]) for i in draft.block_nodes[b.id]] == [k for k in work if k[0] == b.id]
    kinds = {t.kind for t in draft.timings}
    assert kinds == {"graph"} | ({"block"} if level.at_least(ProfilingLevel.PER_BLOCK) else set()) | (
        {"kernel"} if level.at_least(ProfilingLevel.PER_KERNEL) else set()
    )
    assert draft.stamp_count == 1 + len([n for n in draft.nodes if isinstance(n, StampNodePlan)])  # + the end


def _work_key(n) -> tuple[int, int]:
    assert isinstance(n, KernelNodePlan)
    return (n.block_id, n.kernel)


def test_place_stamps_starts_a_span_at_the_end_stamp_of_the_one_block_it_follows() -> None:
    c, (f, s, mix) = _profiled()
    draft = _upto(stamps, c.snapshot())
    out, remap, pairs, count = place_stamps(draft.nodes, ProfilingLevel.PER_BLOCK)
    blocks = {p.key: p for p in pairs if p.kind == "block"}
    assert pairs[0] == TimingPair("graph", None, 0, 1)
    assert blocks[f.id].start == 0 and blocks[s.id].start == blocks[f.id].end  # no stamp on s's path
    own = next(n for n in out if isinstance(n, StampNodePlan) and n.stamp == blocks[mix.id].start)
    assert own.index in out[remap[draft.block_nodes[mix.id][0]]].deps  # mix follows two blocks: a stamp of its own
    assert count == 2 + 3 + 1  # start, end, an end per block, mix's own start


def test_publish_ends_a_graph_with_readback_values_after_every_sink() -> None:
    c, _ = _profiled()
    draft = _upto(publish, c.snapshot())
    publish(draft)
    assert not any(isinstance(n, PublishNodePlan) for n in draft.nodes)  # nothing to read back
    draft = _upto(publish, c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    sinks_before = [n.index for n in draft.nodes if not any(n.index in m.deps for m in draft.nodes)]
    publish(draft)
    last = draft.nodes[-1]
    assert isinstance(last, PublishNodePlan) and last.end_stamp == 1 and list(last.deps) == sinks_before
    f, k = Fill(name="f"), AppendFilter(name="k")
    c2 = _ctx(f, k)
    c2.connect(f, "Out", k, "In")
    draft = _upto(publish, c2.snapshot())
    publish(draft)
    assert draft.nodes[-1] == PublishNodePlan(3, (2,), None)  # counters only: no end stamp


def test_compile_plan_is_the_phases_in_sequence() -> None:
    c, _ = _profiled()
    snap = c.snapshot()
    for level in ProfilingLevel:
        draft = PlanDraft(snap, level=level)
        for phase in PIPELINE:
            phase(draft)
        plan, expected = draft.plan(), compile_plan(snap, level=level)
        assert plan == expected and plan.scalar_slots == expected.scalar_slots
        assert plan.block_nodes == expected.block_nodes and plan.outputs == expected.outputs
