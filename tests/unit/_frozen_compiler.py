"""The graph compiler: a PatchSnapshot in, a GraphPlan out. Pure: no driver calls.

Steps: validate links (unknown port, type mismatch, blocks of another engine) → topological order
of blocks (cycle → error) → per block: resolve inputs (link, external binding, or skip the block
with a warning when a required input is missing), resolve sizes, plan output/internal/append
buffers, build kernel nodes with argument sources → dependencies from buffer hazards (read after
write, write after read, write after write) → one memset node zeroing all append counters first.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import NamedTuple

from cudapatch.blocks.description import SizeRule
from cudapatch.engine.connections import Link
from cudapatch.engine.context import PatchSnapshot
from cudapatch.engine.diagnostics import Diagnostic, Severity
from cudapatch.engine.plan import (
    Arg,
    BufferPlan,
    CapturedNodePlan,
    GraphPlan,
    KernelNodePlan,
    MemsetNodePlan,
    NodePlan,
    PublishNodePlan,
    Slot,
    StampNodePlan,
    TimingPair,
    WorkNode,
)
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.errors import GraphCompileError
from cudapatch.kernels.types import DType

__all__ = ["compile_plan"]

# Building NamedTuples through tuple.__new__ skips their Python-level __new__: several times faster,
# and a 100-block rebuild builds about a thousand of them.
_new = tuple.__new__
_SIZE_ROLES = ("itemsize", "stride0")


class _Source(NamedTuple):
    kind: str  # "buffer" | "external" | "null"
    ref: object
    count: int


def _topological_order(snap: PatchSnapshot, links: list[Link]) -> tuple[list[int], list[int]]:
    """Kahn's algorithm, ties broken by registration order. Returns (order, blocks left in cycles)."""
    rank = {b.id: i for i, b in enumerate(snap.blocks)}
    indegree = {b.id: 0 for b in snap.blocks}
    succ: dict[int, list[int]] = {b.id: [] for b in snap.blocks}
    for lk in links:
        succ[lk.src].append(lk.dst)
        indegree[lk.dst] += 1
    ready = [(rank[b], b) for b, deg in indegree.items() if deg == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, b = heapq.heappop(ready)
        order.append(b)
        for s in succ[b]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, (rank[s], s))
    remaining = [b.id for b in snap.blocks if indegree[b.id] > 0]
    return order, remaining


def compile_plan(
    snap: PatchSnapshot,
    kernel_status: Mapping[tuple[int, int], tuple[Severity, str, str]] | None = None,
    level: ProfilingLevel = ProfilingLevel.NONE,
    faulted: Mapping[int, str] | None = None,
) -> GraphPlan:
    """Compile a patch snapshot into a GraphPlan.

    Args:
        snap: The patch.
        kernel_status: ``(block_id, kernel index)`` → ``(severity, code, message)`` for kernels that
            cannot run yet (still compiling, or failed with no earlier version to fall back on).
            Their blocks are left out, like blocks with a missing input, and so are their dependents.
        level: Profiling level: which timestamps to place (see ``_place_stamps``).
        faulted: Blocks whose kernels faulted on the GPU (id → message): their kernels are left out,
            their outputs are zero-filled by memset nodes each frame, and blocks reading them are warned.

    Raises:
        GraphCompileError: validation errors (its ``diagnostics`` name every block and port involved).
    """
    errors: list[Diagnostic] = []
    warnings: list[Diagnostic] = []
    blocks = {b.id: b for b in snap.blocks}

    def err(block_id: int | None, code: str, msg: str) -> None:
        errors.append(Diagnostic("error", block_id, code, msg))

    for b in snap.blocks:
        if b.context_id != snap.context_id:
            err(b.id, "cross-engine", f"block '{b.name}' belongs to another engine")

    valid_links: list[Link] = []
    incoming: dict[tuple[int, str], Link] = {}
    for lk in snap.links:
        src, dst = blocks.get(lk.src), blocks.get(lk.dst)
        if src is None or dst is None:
            present = dst or src
            err(
                present.id if present else None,
                "cross-engine",
                f"link {lk.src_port} -> {lk.dst_port} of '{present.name if present else '?'}' reaches a block that is "
                "not part of this engine",
            )
            continue
        out = src.description.output(lk.src_port)
        inp = dst.description.input(lk.dst_port)
        if out is None:
            err(src.id, "unknown-port", f"block '{src.name}' has no output port '{lk.src_port}'")
            continue
        if inp is None:
            err(dst.id, "unknown-port", f"block '{dst.name}' has no input port '{lk.dst_port}'")
            continue
        if out.dtype != inp.dtype:
            err(
                dst.id,
                "type-mismatch",
                f"link {src.name}.{lk.src_port} ({out.dtype.c_name}) -> {dst.name}.{lk.dst_port} ({inp.dtype.c_name}): "
                "element types differ",
            )
            continue
        key = (lk.dst, lk.dst_port)
        if key in incoming:
            err(dst.id, "duplicate-link", f"input '{dst.name}.{lk.dst_port}' has more than one link")
            continue
        incoming[key] = lk
        valid_links.append(lk)

    order, cyclic = _topological_order(snap, valid_links)
    if cyclic:
        names = ", ".join(blocks[b].name for b in cyclic)
        for b in cyclic:
            err(b, "cycle", f"block '{blocks[b].name}' is part of a cycle ({names})")
    if errors:
        raise GraphCompileError(
            f"{len(errors)} error(s) in the patch: " + "; ".join(d.message for d in errors),
            diagnostics=tuple(errors + warnings),
        )

    buffers: list[BufferPlan] = []
    counters: list[tuple[int, str]] = []
    nodes: list[KernelNodePlan | CapturedNodePlan | MemsetNodePlan] = []
    outputs: dict[tuple[int, str], int] = {}
    appends: dict[tuple[int, str], tuple[int, int]] = {}
    out_sources: dict[tuple[int, str], _Source] = {}
    scalar_slots: dict[tuple[int, str], list[Slot]] = {}
    binding_slots: dict[tuple[int, str], list[Slot]] = {}
    binding_counts: dict[tuple[int, str], int] = {}
    block_nodes: dict[int, list[int]] = {}
    skipped: set[int] = set()
    compiled: list[int] = []
    # Hazard tracking by resource: planned buffer i is the int i, append counter c is -1 - c, an
    # external binding is its (block_id, port) key.
    last_writer: dict[object, int] = {}
    readers: dict[object, set[int]] = {}
    counter_users: list[int] = []

    bindings = snap.bindings
    for bid in order:
        b = blocks[bid]
        d = b.description
        sources: dict[str, _Source] = {}
        skip_reason = None
        for port in d.inputs:
            key = (bid, port.name)
            lk = incoming.get(key)
            if lk is not None:
                if lk.src in skipped:
                    skip_reason = f"input '{port.name}' comes from '{blocks[lk.src].name}', which is not running"
                    break
                if faulted and lk.src in faulted:
                    warnings.append(
                        Diagnostic(
                            "warning",
                            bid,
                            "input-faulted",
                            f"input '{port.name}' of '{b.name}' reads zeros: "
                            f"'{blocks[lk.src].name}' faulted on the GPU",
                        )
                    )
                sources[port.name] = out_sources[(lk.src, lk.src_port)]
                continue
            binding = bindings.get(key)
            if binding is not None:
                sources[port.name] = _Source("external", key, binding.count)
                binding_counts[key] = binding.count
            elif port.required:
                skip_reason = f"required input '{port.name}' is not linked"
                break
            else:
                sources[port.name] = _Source("null", None, 0)
        severity, code = "warning", "input-unlinked"
        if skip_reason is None and kernel_status:
            for ki in range(len(d.kernels)):
                status = kernel_status.get((bid, ki))
                if status is not None:
                    severity, code, skip_reason = status
                    break
        if skip_reason is None:
            for ks in d.kernels:
                check = getattr(ks, "validate", None)  # a captured call checks its input shapes
                if check is not None:
                    problem = check({name: src.count for name, src in sources.items()}, b.values)
                    if problem:
                        severity, code = "error", "library-shape"
                        skip_reason = f"'{ks.descriptor.entry_point}': {problem}"
                        break
        if skip_reason is not None:
            warnings.append(Diagnostic(severity, bid, code, f"block '{b.name}' is not running: {skip_reason}"))
            skipped.add(bid)
            continue

        def resolve(rule: SizeRule, _sources: dict[str, _Source] = sources, _b=b) -> int:
            if rule.fn is None:  # the common rules inline: a rebuild resolves thousands
                if rule.like is not None:
                    n = _sources[rule.like].count
                elif rule.param is not None:
                    n = int(_b.values[rule.param])
                else:
                    n = int(rule.fixed)  # type: ignore[arg-type]
                return max(0, n // rule.divide * rule.scale + rule.extra)
            return rule.resolve(_sources[rule.like].count if rule.like is not None else None, _b.values)

        port_buf: dict[str, int] = {}
        port_counter: dict[str, int] = {}
        for port in d.outputs:
            if port.kind == "through":  # the input's buffer, modified in place, flows on
                src = sources[port.name]
                out_sources[(bid, port.name)] = src
                if src.kind == "buffer":
                    outputs[(bid, port.name)] = src.ref  # type: ignore[assignment]
                continue
            count = resolve(port.size)  # type: ignore[arg-type]
            buf = _new(BufferPlan, (len(buffers), bid, port.name, port.dtype, count, port.kind == "append"))
            buffers.append(buf)
            port_buf[port.name] = buf.index
            outputs[(bid, port.name)] = buf.index
            out_sources[(bid, port.name)] = _new(_Source, ("buffer", buf.index, count))
            if port.kind == "append":
                ci = len(counters)
                counters.append((bid, port.name))
                appends[(bid, port.name)] = (buf.index, ci)
                port_counter[port.name] = ci
        internal_buf = []
        for i, link in enumerate(d.internal_links):
            buf = BufferPlan(len(buffers), bid, f"internal{i}", link.dtype, resolve(link.size))
            buffers.append(buf)
            internal_buf.append(buf.index)

        compiled.append(bid)
        if faulted and bid in faulted:  # no kernels: its outputs read as zeros
            for bi in list(port_buf.values()) + internal_buf:
                node_index = len(nodes)
                deps_z = {last_writer[bi]} if bi in last_writer else set()
                deps_z.update(readers.get(bi, ()))
                nodes.append(MemsetNodePlan(node_index, 0, tuple(sorted(deps_z)), buffer=bi))  # type: ignore[arg-type]
                last_writer[bi] = node_index
                readers[bi] = set()
            continue
        values = b.values
        for ki, (ks, roles) in enumerate(zip(d.kernels, d.kernel_roles, strict=False)):
            desc = ks.descriptor
            node_index = len(nodes)
            args: list[Arg] = []
            reads: list[object] = []
            writes: list[object] = []
            groups = desc.groups
            device_scalars = getattr(desc, "device_scalars", ())
            for pi, (p, (role, ref)) in enumerate(zip(desc.parameters, roles, strict=True)):
                si = len(args)  # slot index of this parameter's value (its "data" slot for ABI arrays)
                count = 0  # element count behind a pointer, for ABI expansions
                if role == "count":
                    args.append(_new(Arg, ("const", p.dtype, False, None, resolve(ref))))  # type: ignore[arg-type]
                    continue
                if role == "scalar":
                    key = (bid, ref)
                    kind = "device" if p.name in device_scalars else "scalar"  # only captured calls have them
                    args.append(_new(Arg, (kind, p.dtype, False, key, values[ref])))  # type: ignore[index]
                    scalar_slots.setdefault(key, []).append((node_index, si))  # type: ignore[arg-type]
                    continue
                res: object = None
                if role == "input":
                    src = sources[ref]  # type: ignore[index]
                    count = src.count
                    if src.kind == "buffer":
                        arg = _new(Arg, ("buffer", p.dtype, True, src.ref, None))
                        res = src.ref
                    elif src.kind == "external":
                        arg = _new(Arg, ("external", p.dtype, True, src.ref, None))
                        res = src.ref
                    else:
                        arg = _new(Arg, ("null", p.dtype, True, None, None))
                elif role == "counter":
                    ci = port_counter[ref]  # type: ignore[index]
                    arg = _new(Arg, ("counter", p.dtype, True, ci, None))
                    res = -1 - ci
                    count = 1
                    counter_users.append(node_index)
                else:  # output, append data, internal link
                    bi = internal_buf[ref] if role == "internal" else port_buf[ref]  # type: ignore[index]
                    arg = _new(Arg, ("buffer", p.dtype, True, bi, None))
                    res = bi
                    count = buffers[bi].count
                group = groups[pi]
                if len(group) == 1:
                    args.append(arg)
                else:  # an ABI expansion (Numba arrays): fill every slot around the data pointer
                    for r in group:
                        if r == "data":
                            si = len(args)
                            args.append(arg)
                        else:
                            v = count if r in ("nitems", "shape0") else (p.dtype.itemsize if r in _SIZE_ROLES else 0)
                            args.append(_new(Arg, ("const", DType.INT64, False, None, v)))
                if arg.kind == "external":
                    binding_slots.setdefault(res, []).append((node_index, si))  # type: ignore[arg-type]
                if res is None:
                    continue
                if p.direction != "out":
                    reads.append(res)
                if p.direction != "in":
                    writes.append(res)
            deps: set[int] = set()
            for r in reads:
                if r in last_writer:
                    deps.add(last_writer[r])
            for w in writes:
                if w in last_writer:
                    deps.add(last_writer[w])
                deps.update(readers.get(w, ()))
            for r in reads:
                readers.setdefault(r, set()).add(node_index)
            for w in writes:
                last_writer[w] = node_index
                readers[w] = set()
            deps.discard(node_index)
            block_nodes.setdefault(bid, []).append(node_index)
            if ks.source is None:  # a captured library call: a child-graph node
                nodes.append(_new(CapturedNodePlan, (node_index, bid, ki, ks, desc, tuple(args), tuple(sorted(deps)))))
                continue
            n_elems = resolve(ks.grid) if ks.grid is not None else 1
            grid = max(1, -(-n_elems // desc.block_size))
            nodes.append(
                _new(
                    KernelNodePlan,
                    (
                        node_index,
                        bid,
                        ki,
                        ks.source,
                        desc,
                        grid,
                        desc.block_size,
                        desc.shared_memory_bytes,
                        tuple(args),
                        tuple(sorted(deps)),
                    ),
                )
            )

    all_nodes: list[NodePlan] = list(nodes)
    if counters:
        # The memset goes first; every index shifts by one and counter users depend on it.
        users = set(counter_users)
        all_nodes = [MemsetNodePlan(0, len(counters))]
        for n in nodes:
            deps = tuple(x + 1 for x in n.deps) + ((0,) if n.index in users else ())
            all_nodes.append(n._replace(index=n.index + 1, deps=tuple(sorted(deps))))

        def shift(slots: dict) -> dict:
            return {k: tuple((ni + 1, ai) for ni, ai in v) for k, v in slots.items()}

        scalar_final = shift(scalar_slots)
        binding_final = shift(binding_slots)
        block_nodes_final = {k: tuple(i + 1 for i in v) for k, v in block_nodes.items()}
    else:
        scalar_final = {k: tuple(v) for k, v in scalar_slots.items()}
        binding_final = {k: tuple(v) for k, v in binding_slots.items()}
        block_nodes_final = {k: tuple(v) for k, v in block_nodes.items()}

    timings: tuple[TimingPair, ...] = ()
    stamp_count = 0
    if level.timed:
        all_nodes, remap, timings, stamp_count = _place_stamps(all_nodes, level)
        scalar_final = {k: tuple((remap[ni], ai) for ni, ai in v) for k, v in scalar_final.items()}
        binding_final = {k: tuple((remap[ni], ai) for ni, ai in v) for k, v in binding_final.items()}
        block_nodes_final = {k: tuple(remap[i] for i in v) for k, v in block_nodes_final.items()}

    if counters or stamp_count:  # readback values: the graph publishes them to the host as its last node
        used = {dep for n in all_nodes for dep in n.deps}
        sinks = tuple(n.index for n in all_nodes if n.index not in used)
        all_nodes.append(PublishNodePlan(len(all_nodes), sinks, 1 if stamp_count else None))

    return GraphPlan(
        nodes=tuple(all_nodes),
        buffers=tuple(buffers),
        counters=tuple(counters),
        block_order=tuple(compiled),
        skipped=tuple(b for b in order if b in skipped),
        diagnostics=tuple(warnings),
        outputs=outputs,
        appends=appends,
        scalar_slots=scalar_final,
        binding_slots=binding_final,
        binding_counts=binding_counts,
        block_nodes=block_nodes_final,
        level=level,
        timings=timings,
        stamp_count=stamp_count,
    )


def _place_stamps(
    nodes: list[NodePlan], level: ProfilingLevel
) -> tuple[list[NodePlan], dict[int, int], tuple[TimingPair, ...], int]:
    """Insert timestamp nodes for ``level`` and renumber.

    Stamp 0 starts the graph (every root waits for it: measured, that costs a frame less than a
    stamp beside the roots); stamp 1, its end, is written by the publish node the compiler adds
    after every sink. A span ends with a stamp that waits for its nodes and that nothing waits for, so it never delays
    the work. A span *starts* when its dependencies are done, and most of the time that moment is
    already stamped: the end stamp of the one block (PerBlock) or node (PerKernel) it depends on,
    or stamp 0 for roots. Only otherwise (several predecessors, a memset) does a span get a start
    stamp of its own, placed on the path: its nodes wait for it (a stamp merely beside a node can
    run after the node starts: measured). Measured on the H100: a stamp on the path costs a chain
    about 1.4 µs per block, a stamp beside it close to nothing.

    Each side stamp is added right after its nodes: added after all the work instead, the graph
    looked cheaper (measured) because the driver ran them all at its end, which measured nothing.

    A block's nodes are contiguous in plan order.
    """
    per_block = level.at_least(ProfilingLevel.PER_BLOCK)
    per_kernel = level.at_least(ProfilingLevel.PER_KERNEL)
    out: list[NodePlan] = [StampNodePlan(0, 0, ())]
    remap: dict[int, int] = {}
    pairs: list[TimingPair] = [TimingPair("graph", None, 0, 1)]
    stamps = 2
    runs: dict[int, list[KernelNodePlan | CapturedNodePlan]] = {}
    for n in nodes:
        if isinstance(n, WorkNode):
            runs.setdefault(n.block_id, []).append(n)
    exits = {
        b: [m.index for m in members if not any(m.index in o.deps for o in members)] for b, members in runs.items()
    }
    node_end: dict[int, int] = {}  # old node index -> the stamp slot after it (PerKernel)
    block_end: dict[int, int] = {}  # block -> the stamp slot after its exits
    exit_block: dict[frozenset[int], int] = {}  # a finished block's exit set -> its block
    left: dict[int, int] = {}
    own_start: dict[int, int] = {}  # block -> index in ``out`` of its own start stamp
    block_start: dict[int, int] = {}  # block -> start stamp slot

    def emit(stamp: int, deps: tuple[int, ...] | list[int]) -> int:
        out.append(StampNodePlan(len(out), stamp, tuple(sorted(set(deps)))))
        return len(out) - 1

    for n in nodes:
        work = isinstance(n, WorkNode)
        b = n.block_id if work else None  # type: ignore[union-attr]
        if work and per_block and b not in left:  # the first node of its block
            members = {m.index for m in runs[b]}
            outside = {d for m in runs[b] for d in m.deps if d not in members}
            left[b] = len(members)
            pairs_start: int
            if not outside:
                pairs_start = 0
            elif frozenset(outside) in exit_block:  # exactly the exits of one finished block
                pairs_start = block_end[exit_block[frozenset(outside)]]
            else:
                pairs_start = stamps
                own_start[b] = emit(stamps, [remap[d] for d in outside])
                stamps += 1
            block_start[b] = pairs_start
        deps = tuple(remap[d] for d in n.deps) or (0,)  # roots wait for the graph's start stamp
        if work and b in own_start:
            deps = tuple(sorted(set(deps) | {own_start[b]}))
        kernel_start = None
        if work and per_kernel:
            if not n.deps:
                kernel_start = 0
            elif len(n.deps) == 1 and n.deps[0] in node_end:
                kernel_start = node_end[n.deps[0]]
            elif b in own_start and all(d not in {m.index for m in runs[b]} for d in n.deps):
                kernel_start = block_start[b]  # its block's own start stamp already waits for its deps
            else:
                kernel_start = stamps
                deps = (emit(stamps, deps),)
                stamps += 1
        idx = len(out)
        out.append(n._replace(index=idx, deps=deps))
        remap[n.index] = idx
        if work and per_kernel:
            node_end[n.index] = stamps
            pairs.append(TimingPair("kernel", (b, n.kernel), kernel_start, stamps))  # type: ignore[union-attr]
            emit(stamps, (idx,))
            stamps += 1
        if work and per_block:
            left[b] -= 1
            if left[b] == 0:  # the last node of its block
                ex = exits[b]
                if per_kernel and len(ex) == 1:
                    end = node_end[ex[0]]
                else:
                    end = stamps
                    emit(stamps, [remap[i] for i in ex])
                    stamps += 1
                block_end[b] = end
                exit_block[frozenset(ex)] = b
                pairs.append(TimingPair("block", b, block_start[b], end))
    # Stamp 1, the graph's end, is written by the publish node that ends every timed graph.
    return out, remap, tuple(pairs), stamps
