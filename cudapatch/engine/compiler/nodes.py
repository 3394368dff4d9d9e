"""The nodes phase: the graph nodes each running block becomes, with every kernel argument's source.

Per block, in order: a kernel node per kernel (grid and block per axis, as the sizes phase found
them from its grid rule's shape), a captured child-graph
node per library call, or, for a block that faulted on the GPU, a memset zeroing the buffer of
each value it makes instead of its kernels. When the plan has append counters, one memset zeroing them all
comes first.

Each argument says where its value comes from (``Arg``): a planned buffer, an external binding, a
scalar parameter (its slot is recorded so a Hot edit patches it in place), a resolved count, an
append counter. Numba kernels take arrays as several ABI slots around the data pointer; those are
filled here too. Each node also lists the resources it reads and writes, for the edges phase.
"""

from __future__ import annotations

from ...blocks.captured import CapturedSpec
from ...blocks.description import KernelSpec
from ...kernels.pacing import checkpoint
from ...kernels.types import DType
from ..plan import Arg, CapturedNodePlan, KernelNodePlan, MemsetNodePlan
from .draft import BlockSizes, NodeDraft, PlanDraft, resolve_count
from .fusion import fused_node
from .probes import add_probes, probe_requests
from .reuse import NodeCache, replay_slots, signature

__all__ = ["block_nodes", "counters_memset", "node_env", "nodes"]

_new = tuple.__new__  # skips NamedTuple.__new__: several times cheaper (see plan.py)
_SIZE_ROLES = ("itemsize", "stride0")
_NO_TAIL: tuple = ()
_FLAT = ((1, 1, 1, 1),)  # KernelNodePlan.yz of a 1-D launch
_COUNTERS = (None,)  # MemsetNodePlan.buffer of the counters' memset: no buffer


def nodes(draft: PlanDraft, cache: NodeCache | None = None) -> None:
    """Fill ``draft.drafts`` (nodes in launch order, deps still open), ``counter_users``,
    ``scalar_slots``, ``binding_slots`` and ``block_nodes``. With ``cache``, the drafts of blocks
    nothing changed for are taken from the last plan (``reuse.py``)."""
    env = node_env(draft)
    counters_memset(draft)
    probes = probe_requests(draft)  # probed wires: a probe node right after the block that makes the value
    for sized in draft.sized.values():
        checkpoint()  # off the frame thread: a frame that runs now first (``pacing.FrameGuard``)
        block_nodes(draft, sized, env, probes, cache)


def node_env(draft: PlanDraft) -> tuple:
    """What ``block_nodes`` reads and fills, handed over as one tuple: unpacked once per node, not looked
    up as attributes for every argument (a 100-block rebuild fills about a thousand arguments)."""
    return (
        draft.value_buffer,
        draft.value_counter,
        draft.values,
        draft.scalar_slots,
        draft.binding_slots,
        draft.counter_users,
    )


def counters_memset(draft: PlanDraft) -> None:
    """The memset zeroing every append counter, first (node 0), when the plan has counters."""
    if draft.counters:  # zeroed before anything appends
        draft.drafts.append(_new(NodeDraft, (MemsetNodePlan, (0, len(draft.counters)), _COUNTERS, [], [])))


def block_nodes(
    draft: PlanDraft, sized: BlockSizes, env: tuple, probes: dict | None = None, cache: NodeCache | None = None
) -> None:
    """Append the nodes of one running block to ``draft.drafts`` and record them in ``block_nodes``;
    ``probes`` (``probe_requests``): probe nodes right after the block that makes a probed value;
    ``cache``: reuse the block's drafts of the last plan where nothing they depend on changed."""
    drafts = draft.drafts
    b = sized.block
    fused = draft.fusion
    if fused is not None and b.id in fused.member_of:  # one node for the group, at its sink
        group = fused.groups.get(b.id)
        if group is not None:
            draft.block_nodes.update(dict.fromkeys(group.members, (len(drafts),)))
            drafts.append(fused_node(draft, group, len(drafts)))
            if probes and b.id in probes:  # the sink's output (probed intermediates are never fused)
                add_probes(draft, sized, probes[b.id])
        return
    faulted = draft.faulted
    if faulted and b.id in faulted:  # no kernels: the values it makes read as zeros
        value_buffer = draft.value_buffer
        for vi in sized.made:
            bi = value_buffer[vi]
            drafts.append(_new(NodeDraft, (MemsetNodePlan, (len(drafts), 0), (bi,), [], [bi])))
        return
    d = b.description
    first = len(drafts)
    sig = signature(sized, draft.value_buffer, draft.value_counter, draft.buffers) if cache is not None else ()
    reused = cache.take(sized, first, sig) if cache is not None else None
    if reused is not None:
        for nd in reused:
            replay_slots(nd, draft.scalar_slots, draft.binding_slots, draft.counter_users)
        drafts.extend(reused)
    else:
        for ki, (ks, roles) in enumerate(zip(d.kernels, d.kernel_roles, strict=False)):
            drafts.append(_work_node(len(drafts), ki, ks, roles, sized, env))
        if cache is not None:
            cache.put(sized, first, sig, tuple(drafts[first:]))
    if len(drafts) == first + 1:
        draft.block_nodes[b.id] = (first,)
    elif len(drafts) > first:
        draft.block_nodes[b.id] = tuple(range(first, len(drafts)))
    if probes and b.id in probes:
        add_probes(draft, sized, probes[b.id])


def _work_node(
    index: int,
    ki: int,
    ks: KernelSpec | CapturedSpec,
    roles: tuple[tuple[str, object], ...],
    sized: BlockSizes,
    env: tuple,
) -> NodeDraft:
    """Kernel ``ki`` of a block as a kernel node, or a captured node for a library call."""
    value_buffer, value_counter, values, scalar_slots, binding_slots, counter_users = env
    b, sources = sized.block, sized.inputs
    bid, params = b.id, b.values
    desc = ks.descriptor
    expand = desc.abi and desc.groups  # Numba kernels: a parameter may take several slots
    device_scalars = desc.device_scalars if ks.source is None else ()  # only captured calls have them
    args: list[Arg] = []
    reads: list[object] = []
    writes: list[object] = []
    for pi, (p, (role, ref)) in enumerate(zip(desc.parameters, roles, strict=True)):
        if role == "count":
            args.append(_new(Arg, ("const", p.dtype, False, None, resolve_count(ref, sources, params))))  # type: ignore[arg-type]
            continue
        if role == "scalar":
            key = (bid, ref)
            kind = "device" if p.name in device_scalars else "scalar"
            slots = scalar_slots.get(key)  # tuples: a parameter has one slot, seldom two
            scalar_slots[key] = ((index, len(args)),) if slots is None else (*slots, (index, len(args)))
            args.append(_new(Arg, (kind, p.dtype, False, key, params[ref])))  # type: ignore[index]
            continue
        res: object = None
        if role == "input":
            src = sources[ref]  # type: ignore[index]
            count = src.count
            if src.kind == "value":
                res = value_buffer[src.ref]
                arg = _new(Arg, ("buffer", p.dtype, True, res, None))
            elif src.kind == "external":
                res = src.ref
                arg = _new(Arg, ("external", p.dtype, True, res, None))
            else:
                arg = _new(Arg, ("null", p.dtype, True, None, None))
        elif role == "counter":
            ci = value_counter[sized.outputs[ref].ref]  # type: ignore[index]
            arg = _new(Arg, ("counter", p.dtype, True, ci, None))
            res = -1 - ci
            count = 1
            counter_users.add(index)
        else:  # output, append data, internal link
            vi = sized.internal[ref] if role == "internal" else sized.outputs[ref].ref  # type: ignore
            res = value_buffer[vi]
            arg = _new(Arg, ("buffer", p.dtype, True, res, None))
            count = values[vi].count  # the value's own count: a shared buffer may be larger
        if expand and len(expand[pi]) > 1:
            si = _expand(args, arg, expand[pi], count, p.dtype)
        else:
            si = len(args)
            args.append(arg)
        if res is None:
            continue
        if arg.kind == "external":  # a Warm rebind patches this slot
            slots = binding_slots.get(res)  # type: ignore[call-overload]
            binding_slots[res] = ((index, si),) if slots is None else (*slots, (index, si))  # type: ignore[index]
        direction = p.direction
        if direction != "out":
            reads.append(res)
        if direction != "in":
            writes.append(res)
    if ks.source is None:  # a captured library call: a child-graph node
        return _new(NodeDraft, (CapturedNodePlan, (index, bid, ki, ks, desc, tuple(args)), _NO_TAIL, reads, writes))
    (gx, gy, gz), (bx, by, bz) = sized.launches[ki]  # found by the sizes phase from the grid's shape
    head = (index, bid, ki, ks.source, desc, gx, bx, desc.shared_memory_bytes, tuple(args))
    tail = _FLAT if gy == gz == by == bz == 1 else ((gy, gz, by, bz),)  # always given: _new skips defaults
    return _new(NodeDraft, (KernelNodePlan, head, tail, reads, writes))


def _expand(args: list[Arg], arg: Arg, group: tuple[str, ...], count: int, dtype: DType) -> int:
    """Append the slots of one parameter in a Numba kernel's ABI: an array's data pointer and the
    values around it (element count, item size, zeros). Returns the data pointer's slot index."""
    si = len(args)
    for r in group:
        if r == "data":
            si = len(args)
            args.append(arg)
        else:
            v = count if r in ("nitems", "shape0") else (dtype.itemsize if r in _SIZE_ROLES else 0)
            args.append(_new(Arg, ("const", DType.INT64, False, None, v)))
    return si
