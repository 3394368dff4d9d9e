"""``cudapatch plan patch.toml``: the compiled plan of a patch file, printed without a GPU.

The patch is loaded through the same ``HostAdapter`` and ``apply_patch`` a host uses, into a
``PlanEngine``: the engine's editing surface on the real ``Context`` and graph compiler, with no
device. ``format_plan`` lists what ``realize`` would build: blocks in launch order, fused groups,
buffers, nodes and the edges between them, and every diagnostic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engine import Context, compile_plan
from ..engine.diagnostics import Diagnostic
from ..engine.plan import CapturedNodePlan, ConditionalNodePlan, GraphPlan, KernelNodePlan, MemsetNodePlan
from ..engine.profiling import ProfilingLevel
from ..errors import GraphCompileError
from .places import located

__all__ = ["PlanEngine", "plan_patch", "format_plan"]


class PlanEngine:
    """What ``HostAdapter`` needs of an engine, with no device: blocks and links go into a
    ``Context``; ``plan()`` compiles it into a ``GraphPlan``.

    Args:
        fuse: Fuse chains of elementwise blocks (as ``Engine(fuse=...)``).
    """

    def __init__(self, *, fuse: bool = True) -> None:
        self.context = Context()
        self.profiling = ProfilingLevel.NONE
        self.fuse = fuse
        self.errors: tuple[Diagnostic, ...] = ()
        self.last_plan: GraphPlan | None = None
        #: Block id -> ``path:line`` of the patch file's operator that made it (set by ``plan_patch``).
        self.places: dict[int, str] = {}

    def add(self, block: Any) -> Any:
        return self.context.register_block(block)

    def remove(self, block: Any) -> None:
        self.context.unregister_block(block)

    def place(self, block: Any, region: Any) -> None:
        """As ``Engine.place``: ``block`` inside ``region`` (an If/While/For), or at the top level with None."""
        self.context.place(block, region)

    def connect(self, src: Any, src_port: str, dst: Any, dst_port: str) -> None:
        self.context.connect(src, src_port, dst, dst_port)

    def disconnect(self, src: Any, src_port: str, dst: Any, dst_port: str) -> bool:
        return self.context.disconnect(src, src_port, dst, dst_port)

    def set_profiling(self, level: Any) -> None:
        self.profiling = ProfilingLevel.parse(level)

    def keep(self, block: Any, port: str, keep: bool = True) -> None:
        """As ``Engine.keep`` (a patch file's ``[engine] keep``): the port gets a buffer of its own."""
        self.context.keep(block, port, keep)

    def diagnostics(self, block: Any = None) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.errors if block is None or d.block_id == block.id)

    def update(self) -> None:
        """A host's cook: compile the plan (``last_plan``)."""
        self.last_plan = self.plan()

    def plan(self) -> GraphPlan | None:
        """The plan of the patch as it stands; None when validation fails (``errors`` says why)."""
        try:
            plan = compile_plan(self.context.snapshot(), level=self.profiling, fuse=self.fuse)
        except GraphCompileError as exc:
            self.errors = exc.diagnostics
            return None
        self.errors = plan.diagnostics
        return plan


def plan_patch(path: str | Path, *, fuse: bool | None = None) -> tuple[PlanEngine, GraphPlan | None]:
    """Load the patch file at ``path`` into a ``PlanEngine`` and compile it (``fuse``: None follows the
    patch's ``[engine] fuse``, on by default, as ``cudapatch run`` does).

    Raises:
        PatchFileError: the file is missing or invalid (with the line).
        PluginError: a block type's plugin failed to load.
    """
    from .adapter import HostAdapter
    from .manager import PluginHost
    from .patch import apply_patch, load_patch
    from .places import operator_places

    plugins = PluginHost()
    patch = load_patch(path, plugins.registry)
    engine = PlanEngine(fuse=patch.fuse if fuse is None else fuse)
    adapter = HostAdapter(engine, plugins.registry, search_paths=[Path(path).resolve().parent])
    apply_patch(adapter, patch)
    engine.places = operator_places(adapter, patch)
    return engine, engine.plan()


def _names(engine: PlanEngine) -> dict[int, str]:
    return {b.id: b.name for b in engine.context.registry}


def format_plan(engine: PlanEngine, plan: GraphPlan | None) -> str:
    """The plan as text: blocks, fused groups, buffers, nodes, edges, diagnostics."""
    names = _names(engine)
    blocks = {b.id: b for b in engine.context.registry}
    lines: list[str] = []
    if plan is None:
        lines.append("the patch does not compile:")
        lines += [f"  {d.severity}: {located(d, engine.places)}" for d in engine.errors]
        return "\n".join(lines)
    kernels = sum(isinstance(n, KernelNodePlan) for n in plan.nodes)
    lines.append(
        f"plan: {len(plan.block_order)} blocks running, {len(plan.nodes)} nodes ({kernels} kernels), "
        f"{len(plan.buffers)} buffers ({plan.total_buffer_bytes:,} bytes), profiling {plan.level.name}"
    )
    lines.append("blocks (launch order):")
    for bid in plan.block_order:
        b = blocks[bid]
        nodes = ", ".join(f"[{i}]" for i in plan.block_nodes.get(bid, ()))
        lines.append(f"  {b.name:<16} {b.type_name:<14} nodes {nodes or '-'}")
    for bid in plan.skipped:
        lines.append(f"  {names.get(bid, bid)!s:<16} not running")
    groups = [n for n in plan.nodes if isinstance(n, KernelNodePlan) and getattr(n.source, "members", ())]
    lines.append(f"fused groups: {len(groups) or 'none'}")
    for n in groups:
        members = " -> ".join(names.get(m, str(m)) for m in n.source.members)  # type: ignore[attr-defined]
        lines.append(f"  node [{n.index}]: {members}")
        program = getattr(n.source, "program", None)
        if program is not None:
            lines += [f"      {line}" for line in program.summary().splitlines()]
    lines.append("buffers:")
    for buf in plan.buffers:
        owner = names.get(buf.block_id, str(buf.block_id))
        kind = " (append)" if buf.append else ""
        lines.append(f"  [{buf.index}] {owner}.{buf.label}: {buf.count} x {buf.dtype.c_name}{kind}")
    lines.append("nodes:")
    for n in plan.nodes:
        depth, p = 0, n.index
        while p in plan.scopes:  # a node in a region's body: indented under its conditional node
            depth, p = depth + 1, plan.scopes[p]
        if depth:
            lines.append("  " * depth)  # the node's line is appended to this indent below
        if isinstance(n, KernelNodePlan):
            args = []
            for a in n.args:
                if a.kind == "buffer":
                    args.append(f"buf{a.ref}")
                elif a.kind == "scalar":
                    args.append(f"{a.ref[1]}={a.value}")  # type: ignore[index]
                elif a.kind == "external":
                    args.append(f"ext:{names.get(a.ref[0], a.ref[0])}.{a.ref[1]}")  # type: ignore[index]
                else:
                    args.append(f"{a.value}" if a.kind == "const" else a.kind)
            owner = names.get(n.block_id, str(n.block_id))
            kind = "fused kernel" if getattr(n.source, "members", ()) else "kernel"
            lines.append(f"  [{n.index}] {kind} {n.entry_point} ({owner}) grid {n.grid}x{n.block} ({', '.join(args)})")
        elif isinstance(n, CapturedNodePlan):
            lines.append(f"  [{n.index}] captured {n.entry_point} ({names.get(n.block_id, n.block_id)})")
        elif isinstance(n, MemsetNodePlan):
            what = f"buffer {n.buffer}" if n.buffer is not None else f"{n.count} append counters"
            lines.append(f"  [{n.index}] memset {what}")
        elif isinstance(n, ConditionalNodePlan):
            lines.append(f"  [{n.index}] {n.kind} conditional ({names.get(n.block_id, n.block_id)}), body:")
        else:
            lines.append(f"  [{n.index}] {type(n).__name__.removesuffix('NodePlan').lower()}")
        if depth:
            lines[-2:] = [lines[-2] + lines[-1]]
    edges = [(d, n.index) for n in plan.nodes for d in n.deps]
    lines.append(f"edges: {len(edges)}")
    lines += [f"  [{a}] -> [{b}]" for a, b in edges]
    if plan.diagnostics:
        lines.append("diagnostics:")
        lines += [f"  {d.severity}: {located(d, engine.places)}" for d in plan.diagnostics]
    return "\n".join(lines)
