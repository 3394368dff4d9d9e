"""The fusion phase: chains and trees of elementwise blocks become one generated kernel.

A block is elementwise when its one kernel says what it computes per element in the expression
language: an ``Expression`` block (its code), or a block whose describe called
``KernelHandle.elementwise`` (``Scale``: ``fma(In, Factor, Offset)``, ``VectorAdd``: ``A + B``; a
plugin's declaration that does not parse or fit its block leaves it unfused with an
``expression-declaration`` warning, every plan). Such a block fuses into the block reading its output
when that link is the output's only reader (no other block, GL writer, delay or probe reads it, and
the output is not kept for the host: ``Engine.keep``/``output``/``read``, a GL bridge, ``keep`` on the
port or in the patch file) and both run over the same element count. A group is the block nobody fuses
into (its sink) with everything fused into it, transitively: a chain or a tree. Its kernel
(``FusedSource``, generated PTX) evaluates the members in order and writes only the sink's output; the
intermediates get no memory traffic (their values keep a one-element placeholder buffer and no output
port, so nothing can read them).

The fused node runs where the sink's node would run, so a group keeps to one graph and to what moving
its members' reads there leaves unchanged: all its members are in one scope (the top level, one
region's body, one child-graph composite: never a body and the graph around it, nor two bodies), and a
member whose input another block writes in place between the member and the sink ends its group's
link there (its node stays where it was). A region's ``Condition``, a ``FrameDelay``'s ``In`` (and so
the copy or ping-pong that carries it inside a body) read their value through a link like any block,
so the value stays stored: at most a group's sink makes it.

Each member's Hot scalars keep a parameter slot of their own in the fused node (``scalar_slots``
keyed by the member's ``(block id, name)``), so a Hot edit patches the fused node as it would have
patched the member's. Results equal the unfused ones bit for bit: every member's value is rounded
to a float exactly as its stored output would be, and the code generator never contracts
operations (see ``cudapatch/expr/ptx_gen.py``).

A structure edit groups again only the blocks from the first group it may change on
(``fusion_resumed``, with the ``FusionState`` the last plan left; ``resume.py`` finds where).

Fusion is on by default (``Engine(fuse=False)``, ``fuse = false`` in a patch file's ``[engine]``, or
``fuse=False`` on one block turn it off). Nothing fuses when the profiling level times blocks or
kernels (PerBlock and up: each needs its own node), for blocks disabled by a GPU fault, for bypassed
blocks (``enabled`` off: the Bypass tier turns a block's own node off; ``engine/bypass.py`` asks for
the rebuild that takes a member out of its group), or when ``compile_plan(fuse=False)`` (the fault
replay: a fault is pinned on a block, never on a group).
"""

from __future__ import annotations

import re
import weakref
from collections import ChainMap, Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice, repeat
from operator import attrgetter
from typing import Any, NamedTuple

from ...blocks.description import KernelSpec
from ...expr import ExpressionError, Program, ProgramSource, Stage, check, parse
from ...expr.check import Checked, NameKind
from ...expr.ptx_gen import ScalarLoads
from ...kernels.types import DType
from ..context import BlockSnapshot
from ..diagnostics import Diagnostic, DiagnosticCode
from ..plan import Arg, BufferPlan, KernelNodePlan
from ..profiling import ProfilingLevel
from .draft import NodeDraft, PlanDraft, Source
from .memory import pins_written
from .reuse import replay_slots

__all__ = [
    "FUSED_KERNEL",
    "FusedGroup",
    "FusedSource",
    "Fusion",
    "FusionState",
    "Member",
    "elementwise_member",
    "fusion",
    "fusion_resumed",
    "fused_node",
    "in_fused_node",
]

#: The kernel index of a fused node (its ``block_id`` is the group's sink): no block has kernel -1,
#: so the fused kernel's function never mixes with the sink's own.
FUSED_KERNEL = -1

#: Elements each thread of a fused kernel computes once a group has ``FUSED_PER_THREAD_FROM`` elements
#: or more (``generate_ptx(per_thread=...)``). On sm_90 ptxas loads every scalar into a register with
#: an ``LDC`` per thread: a 100-block chain issues 100 of them per element with one thread per
#: element, a quarter of that with four (benchmarks/probes/probe_expression_jit.py measures both).
#: Below the threshold a launch has fewer threads than the GPU holds, so more threads win.
FUSED_PER_THREAD = 4
FUSED_PER_THREAD_FROM = 1 << 18

#: A smaller group (one element per thread) is bound by the latency of one thread's chain, not by
#: memory. Its launch has ``FUSED_SMALL_BLOCK`` threads per block, as CuPy's elementwise kernels, and
#: its scalars are read as ``param`` loads. Measured on the H100 host (``bench_fusion.py
#: --launch-variants``, 100 Scale blocks, 1,024 floats, GPU µs per kernel): ``param`` 1.9 at 64 and
#: 128 threads, 2.0 at 256, 2.6 at 512; ``prefetched`` (every line of the arguments prefetched at the
#: start, ``generate_ptx``) 2.5-3.1 at every shape, and twice as slow at 1M elements. ``prefetched``
#: stays as an option of the generator, not the default.
FUSED_SMALL_BLOCK = 128
FUSED_SMALL_SCALAR_LOADS: ScalarLoads = "param"

#: Kernel arguments a fused node may take: the 4 KB every driver accepts (a group of a thousand
#: scalars would need the 32 KB newer drivers allow); a bigger group runs unfused.
MAX_PARAM_BYTES = 4096

_new = tuple.__new__
_F32 = DType.FLOAT32
_SRC = attrgetter("src")


@dataclass(frozen=True)
class FusedSource(ProgramSource):
    """The generated kernel of a fused group; ``members`` are the block ids, in evaluation order."""

    members: tuple[int, ...] = field(default=(), compare=False, hash=False)


class Member(NamedTuple):
    """An elementwise block as the fusion phase sees it.

    Attributes:
        block_id: The block.
        expr: What it computes per element.
        inputs: Expression input name → the block's input port.
        scalars: Expression scalar name → the block's parameter.
        output: Its output port.
    """

    block_id: int
    expr: Checked
    inputs: dict[str, str]
    scalars: dict[str, str]
    output: str


_DECLARED: dict[tuple[str, tuple[tuple[str, str], ...]], Checked | str] = {}


def _declared(text: str, names: dict[str, NameKind]) -> Checked | str:
    """A plugin's ``k.elementwise`` declaration checked against its ports and scalars (``names``), or
    why it does not hold: the block then runs unfused, with a warning (``_members``)."""
    key = (text, tuple(sorted(names.items())))
    if key not in _DECLARED:
        if len(_DECLARED) > 256:
            _DECLARED.clear()
        found: Checked | str
        try:
            root = parse(text)
        except ExpressionError as exc:
            found = f"does not parse: {exc.message}"
        else:
            try:
                found = check(root, text, names=names)
            except ExpressionError as exc:
                found = f"does not fit its ports and scalars: {exc.message}"
        _DECLARED[key] = found
    return _DECLARED[key]


#: id(description) -> (a weak reference to it, its member's fields but the block id, or None, whether
#: a port of it has ``keep``, and why a plugin's ``k.elementwise`` declaration does not hold, or None).
#: A block keeps its description object while it does not change and a rebuild asks about every block:
#: the checks below run once per description. An entry goes when its description does (no hashing of
#: descriptions, which compare by value, and nothing kept alive).
_TEMPLATES: dict[int, tuple[weakref.ref, tuple | None, bool, str | None]] = {}


def elementwise_member(b: BlockSnapshot | Any) -> Member | None:
    """``b`` as a fusion member, or None when it is not elementwise (see the module docstring)."""
    fields = _template_of(b.description)[0]
    return None if fields is None else _new(Member, (b.id, *fields))


def _template_of(d: Any) -> tuple[tuple | None, bool, str | None]:
    """``(fields, keeps, why)``: ``elementwise_member``'s answer for description ``d`` less the block id,
    whether one of its ports has ``keep``, and why its plugin declaration does not hold (or None);
    cached per description object, see ``_TEMPLATES``."""
    key = id(d)
    entry = _TEMPLATES.get(key)
    if entry is not None and entry[0]() is d:
        return entry[1], entry[2], entry[3]
    found = _template(d)
    fields, why = (None, found) if isinstance(found, str) else (found, None)
    keeps = fields is not None and any(p.keep for p in (*d.inputs, *d.outputs))
    try:
        _TEMPLATES[key] = (weakref.ref(d, lambda _, key=key: _TEMPLATES.pop(key, None)), fields, keeps, why)
    except TypeError:  # a description that takes no weak reference (a test's stand-in): not cached
        pass
    return fields, keeps, why


_SHAPE = "needs one kernel, one float output and float inputs and scalars"


def _template(d: Any) -> tuple | str | None:
    """``elementwise_member``'s answer for description ``d``, less the block id; a text when a plugin's
    ``k.elementwise`` declaration does not hold (why, for the warning ``_members`` gives)."""
    declared = [ks.expression for ks in d.kernels if isinstance(ks, KernelSpec) and ks.expression is not None]
    if not declared:
        return None
    text = declared[0]
    plugin = not isinstance(d.kernels[0].source, ProgramSource)
    if len(d.kernels) != 1 or len(d.outputs) != 1 or d.internal_links:
        return _why(text, _SHAPE) if plugin else None
    ks = d.kernels[0]
    out = d.outputs[0]
    if (
        out.kind != "buffer"
        or out.dtype is not _F32
        or any(p.kind != "buffer" or p.dtype is not _F32 for p in d.inputs)
    ):
        return _why(text, _SHAPE) if plugin else None
    scalars = {p.name for p in d.params if p.kind == "scalar" and p.pins}
    src = ks.source
    if isinstance(src, ProgramSource):  # an Expression block: its own program, names are its ports
        program = src.program
        if program is None or len(program.stages) != 1:
            return None
        expr = program.stages[0].expr
    else:
        names: dict[str, NameKind] = {p.name: "input" for p in d.inputs}
        names.update(dict.fromkeys(scalars, "scalar"))
        found = _declared(ks.expression, names)
        if isinstance(found, str):
            return _why(text, found)
        expr = found
    if any(d.param(s) is None or d.param(s).dtype is not _F32 for s in expr.scalars):  # type: ignore[union-attr]
        return _why(text, _SHAPE) if plugin else None
    return (expr, {n: n for n in expr.inputs}, {n: n for n in expr.scalars}, out.name)


def _why(text: str, problem: str) -> str:
    return f"its declaration k.elementwise({text!r}) {problem}"


@dataclass(eq=False)
class FusedGroup:
    """One fused kernel: its members (sink last), program, source and what feeds it.

    Attributes:
        sink: The block whose output the kernel writes.
        members: Block ids in evaluation order.
        program: The generated program.
        source: Its kernel source.
        inputs: The source of each program input (a value or an external binding).
        scalars: ``(block id, parameter)`` of each program scalar.
        count: Elements of the launch.
    """

    sink: int
    members: tuple[int, ...]
    program: Program
    source: FusedSource
    inputs: tuple[Source, ...]
    scalars: tuple[tuple[int, str], ...]
    count: int


@dataclass(eq=False)
class Fusion:
    """The fusion phase's result: groups by sink, and each member's sink."""

    groups: dict[int, FusedGroup] = field(default_factory=dict)
    member_of: dict[int, int] = field(default_factory=dict)


def _ident(text: str) -> str:
    if text.isascii() and text.isidentifier():  # the common name: nothing to replace (and fast)
        return text
    out = re.sub(r"\W", "_", text, flags=re.ASCII)
    return out if out and not out[0].isdigit() else f"b{out}"


@dataclass(eq=False, slots=True)
class FusionState:
    """What one fusion phase leaves for the next to resume from (incremental planning, ``resume.py``);
    each dict in the order of the blocks (topological).

    Attributes:
        members: The elementwise blocks that run, as members.
        count: Each member's output element count.
        flagged: Members with a ``keep`` port.
        size: Member -> argument bytes of the fused tree ending at it (``_fit_launches``, before the cut
            at its consumer).
        result: The phase's groups.
        readers: Block id -> the links from it (the next plan counts only the links added and removed).
        warned: Block id -> the warning of a plugin block whose ``k.elementwise`` declaration does not
            hold (it runs unfused); every plan gives them all.
    """

    members: dict[int, Member]
    count: dict[int, int]
    flagged: list[int]
    size: dict[int, int]
    result: Fusion
    readers: Counter
    warned: dict[int, Diagnostic] = field(default_factory=dict)


def fusion(draft: PlanDraft, *, fuse: bool = True) -> FusionState | None:
    """Fill ``draft.fusion`` with the fused groups of the blocks that run (after ``sizes``); make the
    intermediates' values one-element placeholders without an output port.

    Returns:
        What ``fusion_resumed`` resumes from in the next plan; None when nothing may fuse (fusion off).
    """
    draft.fusion = None
    if not fuse or draft.level.at_least(ProfilingLevel.PER_BLOCK):
        return None
    members: dict[int, Member] = {}  # in the order of ``sized``: topological
    count: dict[int, int] = {}  # member → its output's element count
    flagged: list[int] = []  # members with a ``keep`` port
    warned: dict[int, Diagnostic] = {}
    _members(draft, draft.sized.items(), members, count, flagged, warned)
    draft.warnings.extend(warned.values())
    consumer: dict[int, int] = {}  # member → the member it fuses into
    producers: dict[int, list[int]] = {}  # the reverse
    size: dict[int, int] = {}
    # a member has one output: its links are the links from its block
    readers = Counter(map(_SRC, draft.links))
    state = FusionState(members, count, flagged, size, Fusion(), readers, warned)
    if len(members) >= 2:
        extra = _extra(draft, members.get, flagged)
        _link(draft, members, members.get, count, readers, extra, consumer, producers)
    _fit_launches(members, consumer, producers, size)  # the sizes also when nothing fuses: a later plan resumes
    if not consumer:
        return state
    _keep_reads_before_writes(draft, members.get, consumer)
    _make_groups(draft, members, consumer, state.result)
    draft.fusion = state.result if state.result.groups else None
    return state


def fusion_resumed(draft: PlanDraft, state: FusionState, dropped: set[int], start: int) -> FusionState | list[int]:
    """``fusion`` from running block ``start`` of ``draft.sized`` on: the groups of the blocks before it
    are the last plan's (``state``, which ``resume.py`` chose ``start`` for: no group of it has a block on
    both sides, and no block before it gained or lost a reader or was bypassed).

    Args:
        draft: The plan under construction (sized, delays found).
        state: What the last plan's phase left (changed in place when this returns a state), its
            ``readers`` counting this patch's links already.
        dropped: The blocks of the last plan from the first one planned again on: their entries leave ``state``.
        start: The index in ``draft.sized`` of the first block planned again.

    Returns:
        The state for the next plan; or, when a block before ``start`` would now fuse into one after it
        (the cut that kept it apart no longer holds), those blocks and nothing changed: planned again
        from earlier, ``start`` does not hold.
    """
    draft.fusion = None
    old_members = state.members

    def get(bid: int) -> Member | None:  # a member, before ``start`` or after it
        m = new.get(bid)
        if m is None and bid not in dropped:
            m = old_members.get(bid)
        return m

    new: dict[int, Member] = {}
    count: dict[int, int] = {}
    flagged: list[int] = []
    warned = {b: w for b, w in state.warned.items() if b not in dropped}  # the blocks before ``start``
    _members(draft, islice(draft.sized.items(), start, None), new, count, flagged, warned)
    old_count = state.count
    consumer: dict[int, int] = {}
    producers: dict[int, list[int]] = {}
    size: dict[int, int] = {}
    if new:
        readers = state.readers
        flagged_all = [b for b in state.flagged if b not in dropped] + flagged
        extra = _extra(draft, get, flagged_all)
        counts = ChainMap(count, old_count)
        _link(draft, new, get, counts, readers, extra, consumer, producers)
        old_size = state.size
        for ps in producers.values():  # producers before ``start``: their trees are the last plan's
            for p in ps:
                if p not in new:
                    size[p] = old_size[p]
    _fit_launches(new, consumer, producers, size)
    earlier = [src for src in consumer if src not in new]
    if earlier:
        return earlier
    if consumer:
        _keep_reads_before_writes(draft, get, consumer, start)
    for table in (old_members, old_count, state.size, state.result.member_of, state.result.groups):
        for bid in dropped:
            table.pop(bid, None)
    old_members.update(new)
    old_count.update(count)
    state.flagged = [b for b in state.flagged if b not in dropped] + flagged
    for b in new:
        state.size[b] = size[b]
    state.warned = warned
    draft.warnings.extend(warned.values())
    if consumer:
        _make_groups(draft, new, consumer, state.result)
    draft.fusion = state.result if state.result.groups else None
    return state


def _members(
    draft: PlanDraft, items: Iterable, members: dict[int, Member], count: dict, flagged: list, warned: dict
) -> None:
    """The elementwise blocks among ``items`` (``sized`` entries) that may fuse: not faulted, not bypassed
    (its node must be one the Bypass tier can turn off alone), every input of their expression given.
    A plugin block whose ``k.elementwise`` declaration does not hold gets a warning in ``warned``."""
    faulted = draft.faulted or {}
    bypassed = draft.snap.bypassed
    templates = _TEMPLATES
    for bid, s in items:
        if bid in faulted or bid in bypassed:
            continue
        d = s.block.description
        entry = templates.get(id(d))
        fields, keeps, why = entry[1:] if entry is not None and entry[0]() is d else _template_of(d)
        if fields is None:
            if why is not None:
                message = f"block '{s.block.name}' runs unfused: {why}"
                warned[bid] = Diagnostic("warning", bid, DiagnosticCode.EXPRESSION_DECLARATION, message)
            continue
        ins = s.inputs
        for p in fields[1].values():
            if ins[p].kind == "null":
                break
        else:
            members[bid] = _new(Member, (bid, *fields))
            count[bid] = s.outputs[fields[3]].count
            if keeps:
                flagged.append(bid)


def _extra(draft: PlanDraft, get: Callable[[int], Member | None], flagged: list[int]) -> set:
    """The members' outputs read besides their one link: by a probe, or kept (``_kept``)."""
    extra = {key for key, _ in draft.snap.probes}  # a probe reads the value too: it keeps its buffer
    extra.update(_kept(draft, get, flagged))  # the host (output/read), GL or a patch file's keep reads it
    return extra


def _link(
    draft: PlanDraft,
    members: dict[int, Member],
    get: Callable[[int], Member | None],
    count: Mapping[int, int],
    readers: Counter,
    extra: set,
    consumer: dict[int, int],
    producers: dict[int, list[int]],
) -> None:
    """Fill ``consumer`` (member → the member it fuses into) and ``producers`` (the reverse) for the links
    into ``members``, from any member ``get`` knows: a producer's output has that link as its one reader,
    the same element count, the same scope, and nobody else reads it."""
    scope = _scopes(draft)
    incoming = draft.incoming
    for bid, m in members.items():
        for port in m.inputs.values():
            lk = incoming.get((bid, port))
            if lk is None:
                continue
            src = lk.src
            up = get(src)
            if up is None or src in consumer or readers[src] != 1 or count[src] != count[bid]:
                continue
            if scope and scope.get(src) != scope.get(bid):  # one node may not run both inside and outside
                continue
            if lk.src_port == up.output and (not extra or (src, up.output) not in extra):
                consumer[src] = bid
                ps = producers.get(bid)
                if ps is None:
                    producers[bid] = [src]
                else:
                    ps.append(src)


def _make_groups(draft: PlanDraft, members: dict[int, Member], consumer: dict[int, int], result: Fusion) -> None:
    """Add the groups of ``members`` (``consumer`` links them) to ``result``: each sink with everything
    fused into it, its program, and its intermediates made placeholders without an output port."""
    sized = draft.sized
    sink_of: dict[int, int] = {}
    for bid in reversed(members):  # reverse topological order: a member's consumer has its sink already
        c = consumer.get(bid)
        sink_of[bid] = bid if c is None else sink_of[c]
    groups: dict[int, list[int]] = {}
    for bid in members:  # topological order: each group's members in evaluation order
        sink = sink_of[bid]
        ids = groups.get(sink)
        if ids is None:
            groups[sink] = [bid]
        else:
            ids.append(bid)
    values, ports, member_of = draft.values, draft.ports, result.member_of
    for sink, ids in groups.items():
        if len(ids) < 2:
            continue
        group_members = [members[b] for b in ids]
        # the launch would not take its arguments: run unfused (the scalars alone tell, mostly: no program made)
        if _param_bytes(1, sum(len(m.scalars) for m in group_members)) > MAX_PARAM_BYTES:
            continue
        group = _group(draft, sink, group_members)
        if _param_bytes(len(group.inputs), len(group.scalars)) > MAX_PARAM_BYTES:
            continue
        result.groups[sink] = group
        member_of.update(dict.fromkeys(ids, sink))
        for m in group_members[:-1]:  # the intermediates: nothing reads them outside the kernel
            b = m.block_id
            vi = sized[b].outputs[m.output].ref
            assert isinstance(vi, int)
            v = values[vi]
            values[vi] = _new(BufferPlan, (vi, b, f"{v.label} (fused)", v.dtype, 1, False))
            ports.pop((b, m.output), None)


def _scopes(draft: PlanDraft) -> dict[int, tuple[int | None, int | None]]:
    """Block id → the graph its nodes go into: ``(region, composite)``, the region whose body holds it
    (``draft.parents``, a patch with regions) and the outermost ``child_graph`` composite holding it;
    blocks of the top-level graph are absent. A fused group stays in one graph: never across a body's
    boundary (a body runs its own nodes, again for every iteration), nor across a child graph's
    (``child_graphs.py`` makes the composite's nodes one child-graph node)."""
    child: dict[int, int] = {}
    for c in sorted(draft.snap.composites, key=lambda c: -len(c.members)):  # outermost first
        if c.child_graph:
            for bid in c.members:
                child.setdefault(bid, c.id)
    parents = draft.parents
    return {bid: (parents.get(bid), child.get(bid)) for bid in (*parents, *child)}


#: id(description) -> (a weak reference to it, the input ports its kernels write): as ``_TEMPLATES``, so
#: a rebuild asks each description once (a 10,000-block patch: 2.6 µs a block without it, CPU machine).
_IN_PLACE: dict[int, tuple[weakref.ref, tuple[str, ...]]] = {}


def _in_place_inputs(d: Any) -> tuple[str, ...]:
    """The input ports of description ``d`` that one of its kernels writes (``inout``: in place)."""
    key = id(d)
    entry = _IN_PLACE.get(key)
    if entry is not None and entry[0]() is d:
        return entry[1]
    kernels = d.kernels
    names = tuple(p.name for p in d.inputs if kernels and pins_written(kernels, p.pins))
    try:
        _IN_PLACE[key] = (weakref.ref(d, lambda _, key=key: _IN_PLACE.pop(key, None)), names)
    except TypeError:  # a description that takes no weak reference (a test's stand-in): not cached
        pass
    return names


def _keep_reads_before_writes(
    draft: PlanDraft, get: Callable[[int], Member | None], consumer: dict[int, int], start: int = 0
) -> None:
    """Cut the fusion link of each member that reads a value another block writes in place (an
    ``inout`` kernel parameter, a ``through`` port) after the member and before its group's sink. The
    fused kernel runs where the sink runs, so the member's read would move past that write: unfused,
    it reads the value before it. In a patch with regions, the writer may be a block inside a loop
    between the two, or a block of a body the member's group does not belong to. ``start``: the
    members of ``consumer`` and the writers between them and their sinks are at this index of
    ``draft.sized`` or later (a resumed phase)."""
    sized = draft.sized
    written: dict[object, list[int]] = {}  # value index → positions of the blocks writing it in place
    for i, (bid, s) in enumerate(islice(sized.items(), start, None), start):
        if get(bid) is not None:  # an expression writes only its output
            continue
        for name in _in_place_inputs(s.block.description):
            src = s.inputs.get(name)
            if src is not None and src.kind == "value":
                written.setdefault(src.ref, []).append(i)
    if not written or not consumer:
        return
    position = {bid: i for i, bid in enumerate(islice(sized, start, None), start)}
    sink_of: dict[int, int] = {}
    for bid in reversed(position):  # reverse topological order: a member's consumer has its sink already
        c = consumer.get(bid)
        if c is None:
            continue
        sink = sink_of.get(c, c)
        lo, hi = position[bid], position[sink]
        m = get(bid)
        assert m is not None
        if any(
            src.kind == "value" and any(lo < w < hi for w in written.get(src.ref, ()))
            for src in (sized[bid].inputs[port] for port in m.inputs.values())
        ):
            del consumer[bid]  # a sink now: its group's node runs where it ran, before the write
        else:
            sink_of[bid] = sink


def _kept(draft: PlanDraft, get: Callable[[int], Member | None], flagged: list[int]) -> list[tuple[int, str]]:
    """The members' outputs read outside the graph: kept by the host (``Engine.keep``/``output``/``read``,
    a GL bridge, ``keep`` in a patch file: ``snap.kept``) or by the port itself (``keep=True``: the
    members in ``flagged``), and outputs read by a member through a kept input port (a kept input keeps
    the value it reads). Only those members are looked at: a rebuild of a big patch keeps few."""
    kept = draft.snap.kept
    out = []
    for bid, port in kept:
        m = get(bid)
        if m is None:
            continue
        if port == m.output:
            out.append((bid, port))
        elif port in m.inputs.values():
            lk = draft.incoming.get((bid, port))
            if lk is not None:
                out.append((lk.src, lk.src_port))
    for bid in flagged:
        m = get(bid)
        assert m is not None
        d = draft.blocks[bid].description
        port = d.output(m.output)
        if port is not None and port.keep:
            out.append((bid, m.output))
        for name in m.inputs.values():
            lk = draft.incoming.get((bid, name))
            inp = d.input(name)
            if lk is not None and inp is not None and inp.keep:
                out.append((lk.src, lk.src_port))
    return out


#: What a fused group's program and source are made of (see ``_group``) → ``(program, source)``, the
#: most recently used last. A structure edit plans every group again and most come out as they were:
#: their program (stages, key, descriptor) is taken from here instead of made again (at 10,000 Scale
#: blocks, 6 µs a member). The key holds ``id`` of each member's expression: safe, as the entry's
#: program holds those expressions (no other object can have their ids while it lives).
_PROGRAMS: dict[tuple, tuple[Program, FusedSource]] = {}
_PROGRAMS_MAX = 256


def _group(draft: PlanDraft, sink: int, members: list[Member]) -> FusedGroup:
    """The fused group of ``members`` (evaluation order, ``sink`` last). What this plan alone knows
    (where its inputs come from, whose scalars it takes, the element count) is found here each time;
    the program comes from ``_PROGRAMS`` when the members' expressions, names and the way their inputs
    are bound are what an earlier plan had (Hot values are arguments, not part of it)."""
    sized, blocks, incoming = draft.sized, draft.blocks, draft.incoming
    stage_of: dict[int, int] = {}
    input_of: dict[tuple[str, object], int] = {}
    inputs: list[Source] = []
    scalar_keys: list[tuple[int, str]] = []
    shape: list = []  # per member: id(expression), block name, then each input's ref (stage j, or input -1-k)
    for j, m in enumerate(members):
        bid = m.block_id
        shape += (id(m.expr), blocks[bid].name)
        for port in m.inputs.values():
            lk = incoming.get((bid, port))
            if lk is not None:
                i = stage_of.get(lk.src)
                if i is not None:
                    shape.append(i)
                    continue
            src = sized[bid].inputs[port]
            key = (src.kind, src.ref)
            k = input_of.get(key)
            if k is None:
                k = input_of[key] = len(inputs)
                inputs.append(src)
            shape.append(-1 - k)
        scalar_keys += zip(repeat(bid), m.scalars.values())
        stage_of[bid] = j
    ids = tuple(stage_of)
    count = sized[sink].outputs[members[-1].output].count
    per_thread = FUSED_PER_THREAD if count >= FUSED_PER_THREAD_FROM else 1
    loads: ScalarLoads = "param" if per_thread > 1 else FUSED_SMALL_SCALAR_LOADS
    key = (per_thread, loads, *shape)
    found = _PROGRAMS.pop(key, None)
    if found is None:
        found = _program(draft, sink, members, shape, per_thread, loads)
        if len(_PROGRAMS) >= _PROGRAMS_MAX:
            try:
                del _PROGRAMS[next(iter(_PROGRAMS))]  # the least recently used
            except (KeyError, RuntimeError, StopIteration):  # another engine's build thread changed it
                pass
    program, source = found
    if source.members != ids:  # the same kernel made of other blocks (a block renamed back, say)
        source = FusedSource(
            source.key, "ptx", source.name, program, per_thread=per_thread, scalar_loads=loads, members=ids
        )
        found = (program, source)
    _PROGRAMS[key] = found
    return FusedGroup(sink, ids, program, source, tuple(inputs), tuple(scalar_keys), count)


def _program(
    draft: PlanDraft, sink: int, members: list[Member], shape: list, per_thread: int, loads: ScalarLoads
) -> tuple[Program, FusedSource]:
    """The program and source of a group (``_group``; ``shape`` tells how each member's inputs bind)."""
    blocks = draft.blocks
    input_names: list[str] = []
    scalar_names: list[str] = []
    stages: list[Stage] = []
    at = 0
    for m in members:
        name = blocks[m.block_id].name
        label = _ident(name)
        at += 2
        bind: dict = {}
        for expr_name, port in m.inputs.items():
            ref = shape[at]
            at += 1
            if ref >= 0:
                bind[expr_name] = ("stage", ref)
            else:
                k = -1 - ref
                if k == len(input_names):  # its first reader names it
                    input_names.append(f"{label}_{port}")
                bind[expr_name] = ("input", k)
        for expr_name, param in m.scalars.items():
            bind[expr_name] = ("scalar", len(scalar_names))
            scalar_names.append(f"{label}_{param}")
        stages.append(Stage(m.expr, bind, name))
    program = Program(tuple(input_names), tuple(scalar_names), (("Out", len(stages) - 1),), tuple(stages))
    ids = tuple(m.block_id for m in members)
    name = f"fused:{blocks[sink].name}"
    source = FusedSource(program.key, "ptx", name, program, per_thread=per_thread, scalar_loads=loads, members=ids)
    return program, source


def _fit_launches(
    members: dict[int, Member], consumer: dict[int, int], producers: dict[int, list[int]], size: dict[int, int]
) -> None:
    """Cut fusion links (``consumer``: member → the member it fuses into; ``producers``: the reverse) where
    a group's arguments would not fit one launch (``MAX_PARAM_BYTES``): in evaluation order (``members``'
    order), a member whose fused producers bring it over the limit starts a group of its own, reading
    them from buffers. So a chain of 1,000 Scale blocks runs as a few fused kernels, not unfused as a
    whole. ``size`` gets each member's argument bytes of the fused tree ending at it (and holds those
    of producers before ``members``, a resumed phase)."""
    budget = MAX_PARAM_BYTES - _param_bytes(0, 0)
    for b, m in members.items():
        ps = producers.get(b)
        if ps is None:
            size[b] = 4 * len(m.scalars) + 16 * len(m.inputs)
            continue
        own = 4 * len(m.scalars) + 16 * (len(m.inputs) - len(ps))
        total = own
        for p in ps:
            total += size[p]
        if total > budget:
            for p in ps:  # each becomes the sink of its own group; this member reads its buffer
                del consumer[p]
            total = own + 16 * len(ps)
        size[b] = total


def _param_bytes(inputs: int, scalars: int) -> int:
    """The argument bytes of a fused node (``fused_node``) with so many inputs and scalars."""
    return 16 * inputs + 8 + 4 * scalars + 4  # per input a pointer and its count (aligned), out, scalars, n


def fused_node(draft: PlanDraft, group: FusedGroup, index: int) -> NodeDraft:
    """The kernel node of ``group`` at node ``index``, recording its Hot and Warm slots."""
    program, value_buffer = group.program, draft.value_buffer
    args: list[Arg] = []
    reads: list[object] = []
    u32 = DType.UINT32
    for src in group.inputs:
        if src.kind == "value":
            res: object = value_buffer[src.ref]  # type: ignore[index]
            args.append(_new(Arg, ("buffer", _F32, True, res, None)))
        else:  # an external binding: a Warm rebind patches this slot
            res = src.ref
            args.append(_new(Arg, ("external", _F32, True, res, None)))
        reads.append(res)
        args.append(_new(Arg, ("const", u32, False, None, src.count)))
    sink = draft.sized[group.sink]
    out_port = draft.blocks[group.sink].description.outputs[0].name
    out = value_buffer[sink.outputs[out_port].ref]  # type: ignore[index]
    args.append(_new(Arg, ("buffer", _F32, True, out, None)))
    for key in group.scalars:  # each member's Hot scalars: a Hot edit patches these slots
        args.append(_new(Arg, ("scalar", _F32, False, key, draft.blocks[key[0]].values[key[1]])))
    args.append(_new(Arg, ("const", u32, False, None, group.count)))
    desc, per_thread = program.descriptor, group.source.per_thread
    block = desc.block_size if per_thread > 1 else FUSED_SMALL_BLOCK
    grid = max(1, -(-group.count // (block * per_thread)))
    head = (index, group.sink, FUSED_KERNEL, group.source, desc, grid, block, 0, tuple(args))
    nd = _new(NodeDraft, (KernelNodePlan, head, ((1, 1, 1, 1),), reads, [out]))  # yz: a 1-D launch
    replay_slots(nd, draft.scalar_slots, draft.binding_slots, draft.counter_users)
    return nd


def in_fused_node(plan: Any, block_id: int) -> bool:
    """Whether ``block_id`` runs inside a fused kernel of ``plan`` (a ``GraphPlan``): its node is its
    group's, so what that node does (a fault, a timing) is the group's, not the block's alone."""
    nodes = plan.nodes
    return any(getattr(getattr(nodes[i], "source", None), "members", ()) for i in plan.block_nodes.get(block_id, ()))


def regenerate(source: FusedSource, members: dict[int, Any]) -> FusedSource | None:
    """``source`` with every member's expression as its block describes it now (``members``: block
    id → the block), for a Code edit of a member: the same inputs, scalars and bindings, so the same
    descriptor and the running node can take the new kernel in place. A quick source (JITted at a low
    level; its ``upgrade()`` is the optimised build). None when a member is no longer elementwise or
    uses other names (the graph must be rebuilt)."""
    old = source.program
    if old is None:
        return None
    stages = []
    for bid, stage in zip(source.members, old.stages, strict=True):
        block = members.get(bid)
        m = elementwise_member(block) if block is not None else None
        if m is None or set(m.expr.inputs) | set(m.expr.scalars) != set(stage.bind):
            return None
        stages.append(Stage(m.expr, stage.bind, stage.label))
    program = Program(old.inputs, old.scalars, old.outputs, tuple(stages))
    # quick: the edit runs at once; the Code tier swaps in the optimised build (``upgrade``) next
    return FusedSource(
        program.key,
        source.backend,
        source.name,
        program,
        jit="quick",
        per_thread=source.per_thread,
        scalar_loads=source.scalar_loads,
        members=source.members,
    )
