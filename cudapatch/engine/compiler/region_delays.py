"""FrameDelays in a patch with regions: carried by ping-pong or by a copy, not by two alternating graphs.

The two-phase alternation (``engine/phases.py``) is a host choice per launch; inside a ``For`` or
``While`` body the iterations are decided on the device, so there a delay is carried in one of two
ways (kernels in ``engine/delay_copy.py``):

- **Ping-pong**, in a loop unrolled by 2 or more (``Unroll``): ``region_nodes`` makes the loop's
  unroll even and swaps the delay's two buffers in every other copy of the body (``swap_buffers``),
  so iteration k reads ``Out`` and writes ``In`` when k is even, the other way round when k is odd,
  and no iteration copies anything. What the main loop leaves runs in a tail of pairs, then in a tail
  of one copy (never more than one iteration). After the loop, one sync kernel per delay
  (``delay_sync``) reads the loop's iteration counter and copies the newest buffer into the other:
  after the loop both hold the last value, as after a loop carried by copies (readers of ``Out`` or
  of the value linked into ``In`` after the loop, the host, and the next frame's first iteration all
  read it). ``pingpong_delays`` says which delays of a loop qualify: the delay sits directly in the
  loop, and the value linked into its ``In`` is made by a kernel block directly in the loop that
  writes it without reading it first (so nothing reads the ``In`` buffer before it is written in an
  iteration, whichever of the two it is).
- **Copy**, everywhere else (``Unroll`` 1, a delay in an ``If`` or at the top level, a delay
  ping-pong cannot carry): the body reads the delay's ``Out`` buffer and writes its ``In`` buffer, and
  a copy kernel last in the delay's scope copies ``In`` into ``Out`` at the end of every iteration:
  iteration k+1 (and the first iteration of the next frame) reads what iteration k wrote. A top-level
  delay is carried this way once a frame, so the patch keeps one executable graph.

``region_nodes`` calls these while it walks the scopes:

- ``delay_inits``: before a top-level region, the nodes of the delays inside it (at any depth):
  their init kernel writes the start value once, before the loop (enabled for one launch, like any
  delay's: the first frame and after ``reset()``); a node inside a body would run every iteration.
- ``delay_copies``: at the end of a scope, the copy node of each delay placed in it that ping-pong
  does not carry, which the edges phase orders after every writer of ``In`` and every reader of
  ``Out`` in that scope.
- ``pingpong_delays``, ``swap_buffers`` and ``delay_syncs`` for the loops that ping-pong.

Either way the delay's last node (its copy, or its sync) is ``DelayPlan.copy``.

``check_region_delays`` refuses an ``Init`` made inside the region holding the delay (the start
value is written before the region runs).
"""

from __future__ import annotations

from ...kernels.types import DType
from ..delay_copy import COPY_ENTRIES, copy_entry, copy_grid, copy_kernel
from ..diagnostics import DiagnosticCode
from ..plan import Arg, CapturedNodePlan, KernelNodePlan, MemsetNodePlan, ProbeNodePlan
from .draft import NodeDraft, PlanDraft
from .memory import pins_read
from .nodes import block_nodes

__all__ = [
    "check_region_delays",
    "copy_nodes",
    "delay_copies",
    "delay_inits",
    "delay_syncs",
    "delays_in_bodies",
    "pingpong_delays",
    "swap_buffers",
]

_new = tuple.__new__
_FLAT = ((1, 1, 1, 1),)
_WORD = {"4": DType.UINT32, "1": DType.UINT8}  # by the entry's last character


def _outermost(draft: PlanDraft, bid: int) -> int | None:
    """The top-level region holding ``bid``, or None at the top level."""
    parents, top = draft.parents, None
    r = parents.get(bid)
    while r is not None:
        top = r
        r = parents.get(r)
    return top


def delays_in_bodies(draft: PlanDraft) -> dict[int, list[int]]:
    """The running FrameDelays placed inside a region, in order, by the top-level region holding them
    (their nodes are placed by ``delay_inits``)."""
    out: dict[int, list[int]] = {}
    for bid in dict.fromkeys(bid for bid, _, _ in draft.delays):  # a delay of several pairs: once
        if bid in draft.parents and bid in draft.sized:
            out.setdefault(_outermost(draft, bid), []).append(bid)  # type: ignore[arg-type]
    return out


def check_region_delays(draft: PlanDraft) -> None:
    """An error on each delay inside a region whose ``Init`` comes from a block inside that region's
    outermost region: the start value is written before the region runs."""
    for bid, _, _ in draft.delays:
        top = _outermost(draft, bid)
        if top is None:
            continue
        lk = draft.incoming.get((bid, "Init"))
        if lk is not None and (lk.src == top or draft.inside(lk.src, top)):
            draft.error(
                bid,
                DiagnosticCode.DELAY_REGION,
                f"FrameDelay '{draft.blocks[bid].name}': its Init comes from '{draft.blocks[lk.src].name}', inside "
                f"region '{draft.blocks[top].name}'; the start value is written before the region runs, so Init "
                "must come from a block before it",
            )


def delay_inits(draft: PlanDraft, inside: list[int], env: tuple, probes: dict | None) -> None:
    """The nodes of the delays ``inside`` a top-level region (``delays_in_bodies``), before its nodes."""
    for bid in inside:
        block_nodes(draft, draft.sized[bid], env, probes)


def delay_copies(
    draft: PlanDraft, scope: int | None, scope_node: int | None, carried: frozenset[int] | set[int] = frozenset()
) -> None:
    """A copy node ``In`` -> ``Out`` for each fed delay placed in ``scope`` (None: the top level) and
    not in ``carried`` (the delays ping-pong carries), appended to ``draft.drafts`` (inside the body
    of conditional node ``scope_node``) and to the delay's ``block_nodes``, last."""
    vb = draft.value_buffer
    for bid, prev, cur in draft.delays:
        if cur is None or draft.parents.get(bid) != scope or bid not in draft.block_nodes or bid in carried:
            continue
        src, dst = vb[cur], vb[prev]
        index = _delay_kernel(draft, bid, "copy", (src, dst), None, [src], [dst])
        if scope_node is not None:
            draft.scopes[index] = scope_node


def copy_nodes(draft: PlanDraft) -> set[int]:
    """The indices of the delays' copy nodes (profiling leaves them untimed: a top-level delay's copy
    is far from its init kernel, and a block's timed nodes must be contiguous)."""
    return {draft.block_nodes[bid][-1] for bid in draft.copied_delays}


def _written_first(draft: PlanDraft, vi: int, rid: int) -> bool:
    """Whether value ``vi`` is made by a kernel block placed directly in loop ``rid`` whose kernels
    write it without reading it (the condition of ping-pong: see the module docstring)."""
    maker = draft.values[vi].block_id
    sized = draft.sized.get(maker)
    if sized is None or draft.parents.get(maker) != rid or maker in draft.units:
        return False
    d = sized.block.description
    kernels = d.kernels
    for port in d.outputs:
        src = sized.outputs.get(port.name)
        if src is None or src.kind != "value" or src.ref != vi:
            continue
        if port.kind != "buffer":  # a through port (modified in place) or an append output
            return False
        return not pins_read(kernels, port.pins) and all(kernels[p.kernel].source is not None for p in port.pins)
    return False


def pingpong_delays(draft: PlanDraft, rid: int) -> list[tuple[int, int, int]]:
    """``(delay id, Out buffer, In buffer)`` of each delay placed directly in loop ``rid`` that
    ping-pong can carry when the loop is unrolled by 2 or more (see the module docstring)."""
    vb, faulted = draft.value_buffer, draft.faulted or {}
    cond = draft.sized[rid].inputs.get("Condition")  # read after the body by the step kernel, never swapped
    out = []
    for bid, prev, cur in draft.delays:
        if cur is None or draft.parents.get(bid) != rid or bid not in draft.sized or bid in faulted:
            continue
        if cond is not None and cond.kind == "value" and cond.ref in (prev, cur):
            continue
        if _written_first(draft, cur, rid):
            out.append((bid, vb[prev], vb[cur]))
    return out


def swap_buffers(draft: PlanDraft, first: int, swap: dict[int, int]) -> None:
    """Swap the planned buffers of ``swap`` (each pair both ways) in the drafts from ``first`` on: in
    kernel and captured-call arguments, probe and memset buffers, and the resources read and written."""
    drafts = draft.drafts
    for i in range(first, len(drafts)):
        cls, head, tail, reads, writes = drafts[i]
        if cls is KernelNodePlan or cls is CapturedNodePlan:
            args = head[-1]
            head = (
                *head[:-1],
                tuple(
                    a._replace(ref=swap[a.ref]) if a.kind == "buffer" and a.ref in swap else a  # type: ignore[index]
                    for a in args
                ),
            )
        elif cls is ProbeNodePlan:
            head = (*head[:2], swap.get(head[2], head[2]), *head[3:])
        elif cls is MemsetNodePlan and tail[0] is not None:
            tail = (swap.get(tail[0], tail[0]),)
        reads = [swap.get(r, r) if type(r) is int else r for r in reads]
        writes = [swap.get(w, w) if type(w) is int else w for w in writes]
        drafts[i] = _new(NodeDraft, (cls, head, tail, reads, writes))


def delay_syncs(draft: PlanDraft, carried: list[tuple[int, int, int]], counter: int) -> None:
    """After a loop that ping-pongs: a sync kernel per delay of ``carried`` (``pingpong_delays``)
    reading the loop's iteration counter ``counter`` (its index among the counters), appended to
    ``draft.drafts`` (in the scope around the loop: ``region_nodes`` files it) and to the delay's
    ``block_nodes``, last."""
    for bid, prev, cur in carried:
        if bid not in draft.block_nodes:  # a faulted delay: no init kernel, nothing carried
            continue
        index = _delay_kernel(draft, bid, "sync", (prev, cur), counter, [prev, cur, -1 - counter], [prev, cur])
        draft.counter_users.add(index)


def _delay_kernel(
    draft: PlanDraft, bid: int, kind: str, pair: tuple[int, int], counter: int | None, reads: list, writes: list
) -> int:
    """Append delay ``bid``'s ``copy`` (``pair``: from, to) or ``sync`` kernel (``pair``: Out, In; it reads
    loop counter ``counter``) to ``draft.drafts`` and, last, to its ``block_nodes``; returns its index."""
    b = draft.buffers[pair[1] if kind == "copy" else pair[0]]  # the Out buffer
    entry, n = copy_entry(b.count * b.dtype.itemsize, kind)
    source, desc = copy_kernel(entry)
    word = _WORD[entry[-1]]
    args = (
        _new(Arg, ("buffer", word, True, pair[0], None)),
        _new(Arg, ("buffer", word, True, pair[1], None)),
        _new(Arg, ("const", DType.UINT32, False, None, n)),
    )
    if counter is not None:
        args += (_new(Arg, ("counter", DType.UINT32, True, counter, None)),)
    index = len(draft.drafts)
    head = (index, bid, COPY_ENTRIES[entry], source, desc, copy_grid(n), 256, 0, args)
    draft.drafts.append(_new(NodeDraft, (KernelNodePlan, head, _FLAT, reads, writes)))
    draft.block_nodes[bid] = (*draft.block_nodes[bid], index)
    draft.copied_delays.add(bid)
    return index
