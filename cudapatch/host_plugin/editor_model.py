"""``EditorModel``: the node editor's view of a running patch and the actions that edit it.

The imgui panel (``interop/editor.py``) draws what this model says and calls only its actions; the
model knows nothing of imgui, so everything here is tested without a display or a GPU.

- **Views.** ``nodes()`` and ``links()`` describe the patch as the editor draws it: one node per
  operator with its ports as pins, its parameters with their declared types and ranges (``ParamView``
  picks the widget), its position, and, after ``refresh(stats)``, its state, diagnostic text, GPU
  time and append fill; a block whose kernel compiles shows ``Compiling`` (``shown_state``, from what
  the engine's kernel tracker has in flight: ``KernelTracker.compiling``). Views are rebuilt only when
  an edit changed the patch (``version``); a frame with no edit costs one pass over the block
  statistics. The view classes are in ``editor_views.py``, where nodes go (``auto_layout``,
  ``group_rects``) in ``editor_layout.py``.
- **Actions** (``create``, ``delete``, ``connect``, ``disconnect``, ``unlink_input``, ``rename``,
  ``bypass``, ``set_param``, ``move``) each make the one ``HostAdapter`` call that does it, so the
  engine applies it with the cheapest tier (a value is Hot, a link is Cold), then edit the patch file's
  text with ``PatchDocument`` (comments and order kept) and write it. An action the adapter or the
  patch checks refuse returns an ``ActionResult`` with the reason and changes nothing. A refused link
  (element types, an input already linked, a cycle the engine found) also marks its target pin:
  ``refusals()`` gives ``{(op, port): reason}`` until the next edit, for the panel to draw at the pin.
  ``browse(query)``
  lists the block types ``create`` takes, for the block browser (``editor_browser.py``).
- **The file.** After writing, the host's ``PatchReloader`` adopts the new patch, so its watcher
  sees its own write as no change. A file that cannot be written (read-only) keeps the edit in
  memory; ``status`` says so and the next successful write saves it. An edit made outside (another
  editor) is applied by the reloader as before; the model then reads the file again and clears its
  history (its snapshots describe a file that no longer exists).
- **Probes.** ``probe(op, port)`` puts a probe on the wires leaving an output (``WireProbes``,
  ``engine.probe``); ``refresh`` takes their newest statistics into ``probes.latest`` each frame.
- **Regions and composites.** A region (``If``, ``While``, ``For``) is drawn as a group around its own
  node and the operators it holds (``groups()``, ``group_rects``); ``place`` puts an operator into a
  region or takes it out (``region = "..."`` in the file, ``HostAdapter.place``), ``move_group`` moves
  a region with everything it holds as one edit. ``refresh`` reads each loop's iterations of the
  newest completed frame (``engine.iterations``, no stall). A composite is one node; ``open(op)`` draws
  its inside in place (``editor_inside``): its inner blocks as nodes by path (``op/inner``) in a group
  of kind ``composite``, its inner links as wires (``drawn_nodes``, ``drawn_links``), each inner node's
  state and GPU time refreshed only while it is open. The inside is read-only (``inner_problem`` says
  why), except an exposed parameter, which sets the composite's. ``inside(op)`` describes its inner
  blocks, links and exposed names as data.
- **Undo/redo** keep the patch text before and after each edit (``max_history``, 256 by default).
  Undo makes the running patch match the older text through ``apply_patch``, which again changes
  only what differs; renames are undone by renaming back.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..blocks.composite import Composite
from ..blocks.regions import Region
from ..engine.diagnostics import DiagnosticCode
from ..errors import CudapatchError, PatchFileError
from ..expr import ProgramSource
from .adapter import HostAdapter
from .code_errors import CodeError, code_errors
from .editor_browser import BrowserEntry, browse
from .editor_layout import auto_layout, group_rects, node_cell
from .editor_views import (
    ActionResult,
    GroupView,
    InsideView,
    LinkView,
    NodeView,
    ParamView,
    PinView,
    groups_of,
    param_view,
    shown_state,
)
from .generated_code import generated_code
from .patch import Patch, apply_patch, parse_patch
from .patch_writer import PatchDocument
from .wire_probes import WireProbes

__all__ = [
    "EditorModel",
    "ActionResult",
    "NodeView",
    "PinView",
    "ParamView",
    "LinkView",
    "GroupView",
    "InsideView",
    "BrowserEntry",
    "auto_layout",
    "group_rects",
    "source_text",
]

log = logging.getLogger("cudapatch.editor")

_NAME = re.compile(r"^[A-Za-z_][\w-]*$")


@dataclass(frozen=True)
class _Edit:
    label: str
    before: str
    after: str
    rename: tuple[str, str] | None = None


def _shape_text(engine: Any, block: Any, port: str) -> str:
    """The output's shape as text when it has 2 or 3 axes (or channels), else ""."""
    g = getattr(getattr(engine, "resources", None), "graph", None)
    plan = g.plan if g is not None else getattr(engine, "plan", None)
    shapes = getattr(plan, "shapes", None) or {}
    shape = shapes.get((block.id, port))
    return str(shape) if shape is not None else ""


class EditorModel:
    """The editor's model of one running patch.

    Args:
        adapter: The host adapter running the patch.
        patch: The patch running now (its ``text`` is edited).
        path: Where edits are written (None: kept in memory, e.g. the embedded demo).
        adopt: Called with each patch the model wrote (``PatchReloader.adopt``), so the file
            watcher takes the model's own write as no change.
        current: Returns the patch the host runs now (``lambda: reloader.patch``): when it is not the
            last one the model adopted, the file was edited outside and the model reads it again.
        max_history: Edits kept for undo.
    """

    def __init__(
        self,
        adapter: HostAdapter,
        patch: Patch,
        *,
        path: str | Path | None = None,
        adopt: Callable[[Patch], None] | None = None,
        current: Callable[[], Patch] | None = None,
        max_history: int = 256,
    ) -> None:
        self.adapter = adapter
        self.registry = adapter.registry
        self.path = Path(path) if path is not None else None
        self._adopt = adopt
        self._current = current
        self.max_history = max_history
        self.patch = patch
        self.doc = PatchDocument(patch.text)
        self._undo: list[_Edit] = []
        self._redo: list[_Edit] = []
        self._live: _Edit | None = None  # a slider drag in progress: one edit, written when it ends
        self._refused: dict[tuple[str, str], str] = {}  # target pin -> why its last link was refused
        #: Whether the last write failed: the running patch has edits the file lacks.
        self.unsaved = False
        #: One line on the last action or write, for the panel's status bar.
        self.status = "ready"
        #: Bumped by every change of the patch; views are rebuilt when it moves.
        self.version = 0
        self._views: dict[str, NodeView] | None = None
        self._links: list[LinkView] | None = None
        self._groups: dict[str, GroupView] = {}
        self._loops: list[tuple[NodeView, Any, str]] = []  # (view, block, "Count"/"Max") of each loop
        self._owners: dict[int, str] = {}  # block id -> the operator showing it (a composite's inner blocks too)
        self._browsed: tuple[tuple[str, int], list[BrowserEntry]] | None = None  # the last ``browse``, by query
        self._views_version = -1
        #: Probes on wires (``engine.probe``), by the output they read: selected wires show their statistics.
        self.probes = WireProbes(adapter)
        # Open composites (a view, like the probes: not written, not undone). Paths of the open ones (an
        # operator, or ``op/inner`` for one inside it), where inner nodes were dragged (from their
        # composite operator's node), and the views of each open operator's inside (``editor_inside``).
        self._opened: set[str] = set()
        self._offsets: dict[str, tuple[float, float]] = {}
        self._insides: dict[str, Any] = {}
        self._drawn: tuple[dict[str, NodeView], list[LinkView]] = ({}, [])
        # ``apply_patch`` applied the file's bypass flags when the patch was loaded; an adapter built
        # some other way gets them here (a flag already on is not set again).
        if self.doc.bypassed() and hasattr(adapter, "set_bypass"):
            ops = adapter.operators()
            for op in self.doc.bypassed():
                if op in ops and not adapter.bypassed(op):
                    self._set_bypass(op, True)

    # -- views ----------------------------------------------------------------------------------------
    def nodes(self) -> dict[str, NodeView]:
        """Nodes by operator id, in the patch's order (rebuilt only after an edit)."""
        self._sync_external()
        if self._views is None or self._views_version != self.version:
            self._build_views()
        return self._views  # type: ignore[return-value]

    def links(self) -> list[LinkView]:
        """Wires, with element type, count and bytes where the graph has the buffer."""
        self.nodes()
        return self._links  # type: ignore[return-value]

    def groups(self) -> dict[str, GroupView]:
        """Regions and open composites as groups, by region operator or composite path, outer ones before
        the ones they hold (rebuilt with the views). Empty for a patch without regions or open composites."""
        self.nodes()
        return self._groups

    def drawn_nodes(self) -> dict[str, NodeView]:
        """What the panel draws as nodes: the operators' (``nodes()``, the same dict while no composite is
        open), then the inner nodes of open composites by path (``smooth/pass1``)."""
        self.nodes()
        return self._drawn[0]

    def drawn_links(self) -> list[LinkView]:
        """What the panel draws as wires: the patch's links, then the inner links of open composites."""
        self.nodes()
        return self._drawn[1]

    @property
    def opened(self) -> frozenset[str]:
        """Paths of the composites drawn open."""
        self.nodes()
        return frozenset(self._opened)

    def open(self, op: str) -> ActionResult:
        """Draw composite ``op`` open: its inner blocks as nodes in a group with its node, its inner links
        as wires (``op/inner`` for a composite inside an open one). A view: nothing is written or undone."""
        view = self.drawn_nodes().get(op)
        if view is None:
            return self._refuse(f"unknown operator '{op}'")
        if not view.inner:
            return self._refuse(f"'{op}' is not a composite: it has no inside to open")
        if op in self._opened:
            return ActionResult(True, "unchanged")
        self._opened.add(op)
        self.version += 1
        self.status = f"opened {op}"
        return ActionResult(True, self.status)

    def close(self, op: str) -> ActionResult:
        """Draw composite ``op`` as one node again (composites open inside it close too)."""
        gone = {p for p in self._opened if p == op or p.startswith(op + "/")}
        if not gone:
            return ActionResult(False, f"'{op}' is not open")
        self._opened -= gone
        self.probes.remove_inside(op)
        self.version += 1
        self.status = f"closed {op}"
        return ActionResult(True, self.status)

    def inner_problem(self, name: str) -> str | None:
        """Why node ``name`` cannot be edited: it is an inner node of an open composite, whose inside is
        defined by the composite's file (or Python class), not by the patch. None for an operator."""
        if "/" not in name:
            return None
        self.nodes()
        top = name.split("/", 1)[0]
        inside = self._insides.get(top)
        if inside is None:
            return f"no node '{name}' (its composite is not open)"
        where = source_text(inside.block)
        fix = "edit that file (the running patch follows it)" if inside.block.composite_file() else "change that class"

        return (
            f"'{name}' is inside composite '{top}', which is read-only here: its inside comes from {where}; "
            f"{fix}, or set what '{top}' exposes on its node"
        )

    def is_region(self, op: str) -> bool:
        """Whether ``op`` is a region (If, While, For): a group operators can be placed in."""
        view = self.nodes().get(op)
        return view is not None and bool(view.kind)

    def region_of(self, op: str) -> str | None:
        """The region holding ``op`` (None: the top level or no such operator)."""
        view = self.nodes().get(op)
        return view.region if view is not None else None

    def holds(self, region: str, op: str) -> bool:
        """Whether ``region`` holds ``op``, directly or through regions inside it."""
        views = self.nodes()
        seen: set[str] = set()
        cur = views[op].region if op in views else None
        while cur is not None and cur not in seen:
            if cur == region:
                return True
            seen.add(cur)
            cur = views[cur].region if cur in views else None
        return False

    def inside(self, op: str) -> InsideView | None:
        """What composite ``op`` holds (None: not a composite) as plain data: its inner blocks, links and
        exposed names, made when asked (``open`` draws the same inside as nodes in the editor)."""
        if op not in self.adapter.operators():
            return None
        block = self.adapter.block(op)
        layout = getattr(block, "layout", None)
        if not isinstance(block, Composite) or layout is None:
            return None
        blocks = tuple((name, getattr(b, "type_name", type(b).__name__)) for name, b in layout.blocks.items())
        exposed = tuple(
            (e.name, e.kind, ", ".join(f"{t}.{p}" for t, p in e.targets)) for e in layout.exposures.values()
        )
        return InsideView(op, layout.file, blocks, tuple(str(lk) for lk in layout.links), exposed)

    def port_text(self, op: str, port: str, direction: str) -> str:
        """A pin's tooltip: element type, shape and bytes of what it carries (an input: what its wire
        brings), then its description."""
        outer = self.drawn_nodes()[op].exposed.get(port) if "/" in op else None  # an inner pin the composite exposes
        if direction == "out":
            view = self._link_view(op, port, "", "", self._block_of(op))
        else:
            view = next((lk for lk in self.drawn_links() if lk.dst == op and lk.dst_port == port), None)
            if view is None:
                spec = self._block_of(op).description.input(port)
                fed = f"fed by {outer}" if outer else "not linked"
                return f"{spec.pin_type if spec is not None else ''}  {fed}" + (
                    f"\n{spec.description}" if spec is not None and spec.description else ""
                )
        spec = self._block_of(op).description
        p = spec.output(port) if direction == "out" else spec.input(port)
        about = f"\n{p.description}" if p is not None and p.description else ""
        exposed = f"\nexposed as {outer}" if outer else ""
        return f"{op}.{port}\n{view.size_text}{exposed}{about}"

    def _build_views(self) -> None:
        adapter = self.adapter
        ops = adapter.operators()
        link_keys = [(lk.src, lk.src_port, lk.dst, lk.dst_port) for lk in adapter.links()]
        stored = self.doc.positions()
        placed = adapter.regions()
        blocks = {op: adapter.block(op) for op in ops}
        containers = {op for op, b in blocks.items() if isinstance(b, Region)}
        # Laid out over every operator, stored positions or not, so that storing some (a dragged node)
        # leaves where the others are drawn as it was.
        cells = {op: node_cell(b.description) for op, b in blocks.items()}
        insides = self._plan_insides(ops, blocks, placed)
        if insides:  # open composites are laid out with the operators, each as a block like a region's
            items, edges, regions = list(ops), list(link_keys), dict(placed)
            boxes, room = set(containers), dict(cells)
            for inside in insides.values():
                items += inside.ops
                edges += inside.edges
                regions.update(inside.regions)
                boxes |= inside.containers
                room.update(inside.cells)
            layout = auto_layout(items, edges, regions, boxes, room)
        else:
            layout = auto_layout(list(ops), link_keys, placed, containers, cells)
        bypassed = set(self.doc.bypassed())
        old = self._views or {}
        views: dict[str, NodeView] = {}
        loops: list[tuple[NodeView, Any, str]] = []
        for op, type_name in ops.items():
            block = blocks[op]
            desc = block.description
            bt = self.registry.get(type_name)
            view = NodeView(
                name=op,
                type=bt.name,
                doc=bt.doc,
                position=stored.get(op) or layout.get(op, (40.0, 40.0)),
                inputs=tuple(PinView(op, p.name, "in", str(p.pin_type), p.description) for p in desc.inputs),
                outputs=tuple(PinView(op, p.name, "out", str(p.pin_type), p.description) for p in desc.outputs),
                params=tuple(param_view(spec, self._value(op, block, spec)) for spec in desc.params),
                bypassed=op in bypassed,
                block_id=block.id,
                region=placed.get(op),
                kind=block.kind if op in containers else "",
                inner=sum(1 for _ in block.inner_blocks()) if isinstance(block, Composite) else 0,
                source=source_text(block) if isinstance(block, Composite) else "",
                generates=hasattr(type(block), "generated_code"),
            )
            prev = old.get(op)
            if prev is not None:  # keep the last statistics until the next refresh
                view.state, view.message, view.gpu_ms, view.append = prev.state, prev.message, prev.gpu_ms, prev.append
                view.code_errors, view.iterations, view.runs = prev.code_errors, prev.iterations, prev.runs
                view.compiling, view.block_state = prev.compiling, prev.block_state
            views[op] = view
            if view.kind in ("while", "for"):
                loops.append((view, block, "Max" if view.kind == "while" else "Count"))
        self._views = views
        self._loops = loops
        owners = {b.id: op for op, b in blocks.items()}
        for op, b in blocks.items():
            if isinstance(b, Composite):
                owners.update((leaf.id, op) for _, leaf in b.inner_blocks())
        self._owners = owners
        self._groups = groups_of(views)
        self._links = [self._link_view(*key) for key in link_keys]
        self._finish_insides(views, insides, layout)
        self.probes.sync(self._drawn[0])
        self._views_version = self.version

    def _plan_insides(self, ops: dict[str, str], blocks: dict[str, Any], placed: dict[str, str]) -> dict[str, Any]:
        """What each open composite shows inside (``editor_inside.plan_inside``); forgets the open paths
        of composites that are gone."""
        self._opened = {p for p in self._opened if isinstance(blocks.get(p.split("/", 1)[0]), Composite)}
        if not self._opened:
            return {}
        from .editor_inside import plan_inside

        return {
            op: plan_inside(op, b, self._opened, placed.get(op))
            for op, b in blocks.items()
            if op in self._opened and isinstance(b, Composite) and b.layout is not None
        }

    def _finish_insides(self, views: dict[str, NodeView], insides: dict[str, Any], laid: dict[str, Any]) -> None:
        """The views of every open composite's inside, and what the panel draws."""
        self._insides = insides
        if not insides:
            self._drawn = (views, self._links)
            return
        from .editor_inside import finish_inside

        type_names = {bt.cls: (bt.name, bt.doc) for bt in self.registry}
        drawn, links, groups = dict(views), list(self._links), dict(self._groups)
        for op, inside in insides.items():
            view = views[op]
            region = self._groups.get(view.region) if view.region is not None else None
            finish_inside(
                inside,
                view,
                laid=laid,
                offsets={p: at for p, at in self._offsets.items() if p.startswith(op + "/")},
                type_names=type_names,
                link_view=lambda b, *key: self._link_view(*key[:4], b),
                depth=region.depth + 1 if region is not None else 0,
            )
            view.opened = True
            for path, inner in inside.views.items():
                prev = self._drawn[0].get(path)
                if prev is not None and prev.block_id == inner.block_id:  # the last statistics, until the next refresh
                    inner.state, inner.message, inner.gpu_ms = prev.state, prev.message, prev.gpu_ms
            drawn.update(inside.views)
            links += inside.links
            groups.update((g.region, g) for g in inside.groups)
        self._groups = {g.region: g for g in sorted(groups.values(), key=lambda g: g.depth)}
        self._drawn = (drawn, links)

    def _block_of(self, name: str) -> Any:
        """The block of node ``name``: an operator's, or an inner block of an open composite (``op/inner``)."""
        if "/" not in name:
            return self.adapter.block(name)
        top, rest = name.split("/", 1)
        inside = self._insides.get(top)
        if inside is None:
            raise CudapatchError(f"no node '{name}' (its composite is not open)")
        return inside.block.inner(rest)

    def _value(self, op: str, block: Any, spec: Any) -> Any:
        if spec.name in block.params:
            return block.params[spec.name].value
        spec_in_file = self.patch.operators.get(op)  # text parameters (Code, Path): as the file has them
        return spec_in_file.params.get(spec.name, spec.default) if spec_in_file is not None else spec.default

    def _link_view(self, src: str, src_port: str, dst: str, dst_port: str, block: Any = None) -> LinkView:
        block = block if block is not None else self.adapter.block(src)
        port = block.description.output(src_port)
        count = nbytes = None
        engine = self.adapter.engine
        try:
            buf = engine.output(block, src_port, keep=False)  # a tooltip only looks: the wire may stay shared
            count, nbytes = int(buf.count), int(buf.nbytes)
        except (CudapatchError, AttributeError):
            # An engine that only plans (tests) knows the sizes too, and so does the running graph's plan
            # of an output whose buffer a later output reuses (buffer reuse).
            plan = getattr(engine, "plan", None) or getattr(getattr(engine, "graph", None), "plan", None)
            index = plan.outputs.get((block.id, src_port)) if plan is not None else None
            if index is not None and port is not None:
                mem = getattr(plan, "memory", None)
                vi = mem.ports.get((block.id, src_port)) if mem is not None else None
                count = int(mem.values[vi].count if vi is not None else plan.buffers[index].count)
                nbytes = count * port.dtype.itemsize
        shape = _shape_text(engine, block, src_port)
        kind = str(port.pin_type) if port is not None else ""
        return LinkView(src, src_port, dst, dst_port, kind, count, nbytes, shape)

    def refresh(self, stats: Any = None) -> None:
        """Take each node's state, message, GPU time and append fill from ``stats`` (``engine.stats()``;
        None: the adapter's diagnostics only). One pass over the blocks: cheap enough every frame."""
        views = self.nodes()
        if self.probes:
            self.probes.refresh()
        ids = self._compiling()
        compiling = {op for bid in ids if (op := self._owners.get(bid)) is not None} if ids else set()
        if stats is None:
            for view in views.values():
                diags = self.adapter.diagnostics(view.name)
                severities = {d.severity for d in diags}
                # An info (a first compile in flight) is no warning: the block is not built yet.
                waiting = "NotCompiled" if any(d.code == DiagnosticCode.KERNEL_COMPILING for d in diags) else "OK"
                state = "Error" if "error" in severities else "Warning" if "warning" in severities else waiting
                view.block_state = state
                view.state, view.compiling = shown_state(state, view.name in compiling)
                view.message = "; ".join(d.message for d in diags)
                view.code_errors = self._code_errors(view, view.message)
            if self._loops:
                self._read_iterations()
            if self._insides:
                self._refresh_insides(None, ids)
            return
        by_id = {b.block_id: b for b in stats.blocks}
        for view in views.values():
            b = by_id.get(view.block_id)
            if b is None:
                continue
            # Stats carry a first line: the markers read the whole diagnostics. An error's first line can
            # stay the same while its column moves (the same line edited again): those are read each frame.
            if b.message != view.message or (b.message and b.state == "Error"):
                full = "; ".join(d.message for d in self.adapter.diagnostics(view.name)) if b.message else ""
                if full != view.code_source:
                    view.code_source = full
                    view.code_errors = self._code_errors(view, full)
            view.block_state = b.state
            view.state, view.compiling = shown_state(b.state, view.name in compiling)
            view.message, view.gpu_ms = b.message, b.gpu_ms
            view.runs = getattr(b, "runs", None)
            view.append = {port: (a.count, a.capacity) for port, a in b.append.items()} if b.append else {}
        if self._loops:
            self._read_iterations()
        if self._insides:
            self._refresh_insides(stats, ids)

    def _compiling(self) -> frozenset[int]:
        """Ids of the blocks with a kernel compile in flight (``KernelTracker.compiling``: what the engine's
        kernel tracker has pending; an operator shows its inner blocks' too). Empty for an engine without
        one (one that only plans, or an isolated engine, whose compiles happen in its own process)."""
        kernels = getattr(self.adapter.engine, "kernels", None)
        return kernels.compiling() if kernels is not None else frozenset()

    def _refresh_insides(self, stats: Any, compiling: frozenset[int]) -> None:
        """The inner nodes of open composites (only those): states from each one's diagnostics, GPU times
        from ``stats.block_ms``. A composite whose file was read again has a new inside: views made again."""
        from .editor_inside import refresh_inside

        block_ms = getattr(stats, "block_ms", None) if stats is not None else None
        for op, inside in self._insides.items():
            try:
                block = self.adapter.block(op)
            except CudapatchError:  # deleted by the host: the views are stale
                block = None
            if block is not inside.block or block.layout is not inside.layout:
                self.version += 1  # the next ``nodes()`` makes the views again
                return
            refresh_inside(inside, self._views[op], self.adapter.diagnostics(op), block_ms, compiling)  # type: ignore[index]

    def _code_errors(self, view: NodeView, message: str) -> tuple[CodeError, ...]:
        """The errors of ``message`` at lines of the node's ``Code``: locations in the file its kernel
        compiles under only (not an included header's, not a generated kernel's)."""
        code = next((p.value for p in view.params if p.widget == "code"), None)
        if code is None or not message:
            return ()
        files: tuple[str, ...] = ()
        kernels = self.adapter.block(view.name).description.kernels
        for spec in kernels:
            source = getattr(spec, "source", None)
            if source is not None and not isinstance(source, ProgramSource):  # generated code: not the Code's lines
                files += (str(source.debug_name),)
        return code_errors(message, str(code), files)

    def generated_code(self, op: str) -> str | None:
        """The code ``op`` generates for its kernel (an Expression's PTX or CUDA C++; None for a block
        that generates none, or while its ``Code`` does not compile). Generated once per ``Code`` and
        description, not per frame: the panel asks every frame its section is open."""
        return generated_code(self._block_of(op))

    def _read_iterations(self) -> None:
        """Each loop's iterations of the newest completed frame (``engine.iterations``: the readback
        ring, no driver call, never a stall); None before a frame completed or on an engine without it."""
        iterations = getattr(self.adapter.engine, "iterations", None)
        if iterations is None:
            return
        for view, block, limit in self._loops:
            try:
                n = iterations(block)
            except CudapatchError:  # not in the running graph (a rebuild pending)
                n = None
            view.iterations = None if n is None else (int(n), int(block.params[limit].value))

    def probe(self, op: str, port: str) -> ActionResult:
        """Probe the wires leaving output ``port`` of ``op``: their statistics come in ``probes.latest``
        from the next frames on (not an edit of the patch: nothing is written or undone)."""
        if op not in self.drawn_nodes():
            return self._refuse(f"unknown operator '{op}'")
        problem = self.probes.add(op, port, self._block_of(op))
        if problem is not None:
            return self._refuse(f"cannot probe {op}.{port}: {problem}")
        return ActionResult(True, f"probing {op}.{port}")

    def unprobe(self, op: str, port: str) -> ActionResult:
        """Remove the probe on ``op.port``."""
        if not self.probes.remove(op, port):
            return ActionResult(False, f"{op}.{port} is not probed")
        return ActionResult(True, f"probe on {op}.{port} removed")

    def refusals(self) -> dict[tuple[str, str], str]:
        """Pins whose link was refused since the last edit, as ``{(op, port): reason}``: the target pin of
        each refused ``connect`` (the input, or the pin the wire was dropped on), with the whole message.
        The panel marks these pins and shows the reason as their tooltip; the next edit clears them."""
        return dict(self._refused)

    def link_problem(self, src: str, src_port: str, dst: str, dst_port: str) -> str | None:
        """Why a wire from ``src.src_port`` to ``dst.dst_port`` would be refused, checked without
        changing anything (element types, an input already linked, a link to itself); None when it
        looks fine (the engine still has the last word, e.g. on cycles)."""
        problem = self.inner_problem(src) or self.inner_problem(dst)
        if problem is not None:
            return problem
        views = self.nodes()
        if src not in views or dst not in views:
            return "unknown operator"
        out = next((p for p in views[src].outputs if p.name == src_port), None)
        inp = next((p for p in views[dst].inputs if p.name == dst_port), None)
        if out is None or inp is None:
            return "links go from an output to an input"
        if src == dst:
            return "a node cannot feed itself"
        if out.type.split()[-1] != inp.type.split()[-1]:
            return f"{src}.{src_port} gives {out.type}, {dst}.{dst_port} takes {inp.type}"
        if any(lk.dst == dst and lk.dst_port == dst_port for lk in self.adapter.links()):
            return f"{dst}.{dst_port} is already linked (an input takes one link)"
        return None

    def browse(self, query: str = "") -> list[BrowserEntry]:
        """The block browser's listing: every registered block type matching ``query`` (by name, category
        or docstring words), plugins' types included, each with its category and the first line of its
        docstring (``editor_browser.browse``). ``create(entry.name)`` makes one."""
        key = (query, len(self.registry))
        if self._browsed is None or self._browsed[0] != key:  # the panel asks every frame its browser is open
            self._browsed = (key, browse(self.registry, query))
        return list(self._browsed[1])

    # -- actions --------------------------------------------------------------------------------------
    def create(
        self,
        type_name: str,
        name: str | None = None,
        *,
        position: tuple[float, float] | None = None,
        params: dict[str, Any] | None = None,
        region: str | None = None,
    ) -> ActionResult:
        """Create an operator of ``type_name`` (default name: the type's, numbered), inside ``region``
        if given (an If, While or For of the patch)."""
        try:
            bt = self.registry.get(type_name)
        except CudapatchError as exc:
            return self._refuse(exc.message)
        if name is None:
            base = bt.name.rsplit(".", 1)[-1].lower()
            n = 1
            while f"{base}{n}" in self.adapter.operators():
                n += 1
            name = f"{base}{n}"
        if not _NAME.match(name):
            return self._refuse(f"'{name}' is not a valid operator name (letters, digits, _ and -)")

        if region is not None and not self.is_region(region):
            return self._refuse(f"cannot create {name} in '{region}': it is not an If, While or For of this patch")

        def edit(doc: PatchDocument) -> None:
            doc.add_operator(name, bt.name, params, region)
            if position is not None:
                doc.set_position(name, *position)

        def run() -> None:
            self.adapter.create(name, bt.name, params)
            if region is not None:
                try:
                    self.adapter.place(name, region)
                except CudapatchError:
                    self.adapter.delete(name)  # all or nothing: the file keeps no half-made operator
                    raise

        return self._do(f"create {name}" + (f" in {region}" if region else ""), edit, run)

    def delete(self, op: str) -> ActionResult:
        """Delete an operator and its links."""
        if (problem := self.inner_problem(op)) is not None:
            return self._refuse(f"cannot delete: {problem}")
        if op not in self.adapter.operators():
            return self._refuse(f"unknown operator '{op}'")
        return self._do(f"delete {op}", lambda doc: doc.remove_operator(op), lambda: self.adapter.delete(op))

    def connect(self, src: str, src_port: str, dst: str, dst_port: str) -> ActionResult:
        """Link ``src.src_port`` to ``dst.dst_port``; refused with the reason when the pins do not fit."""
        problem = self.link_problem(src, src_port, dst, dst_port)
        if problem is not None:
            result = self._refuse(f"cannot link {src}.{src_port} -> {dst}.{dst_port}: {problem}")
        else:
            text = f"{src}.{src_port} -> {dst}.{dst_port}"
            result = self._do(
                f"link {text}",
                lambda doc: doc.add_link(text),
                lambda: self.adapter.connect(src, src_port, dst, dst_port),
            )
        if not result:  # refused by the checks or by the engine (a cycle): the reason goes to the pin
            self._refused[(dst, dst_port)] = result.message
        return result

    def disconnect(self, src: str, src_port: str, dst: str, dst_port: str) -> ActionResult:
        """Remove a link."""
        problem = self.inner_problem(src) or self.inner_problem(dst)
        if problem is not None:
            return self._refuse(f"cannot unlink {src}.{src_port} -> {dst}.{dst_port}: {problem}")
        key = (src, src_port, dst, dst_port)
        if key not in {(lk.src, lk.src_port, lk.dst, lk.dst_port) for lk in self.adapter.links()}:
            return self._refuse(f"no link {src}.{src_port} -> {dst}.{dst_port}")
        text = f"{src}.{src_port} -> {dst}.{dst_port}"
        return self._do(f"unlink {text}", lambda doc: doc.remove_link(text), lambda: self.adapter.disconnect(*key))

    def link_into(self, op: str, port: str) -> LinkView | None:
        """The wire feeding input ``port`` of node ``op`` (an inner node's too), or None when it is not
        linked."""
        return next((lk for lk in self.drawn_links() if lk.dst == op and lk.dst_port == port), None)

    def unlink_input(self, op: str, port: str) -> ActionResult:
        """Remove the wire feeding input ``port`` of ``op``: what dragging from a linked input pin into
        empty space does in the panel. The same edit as ``disconnect`` (one adapter call, written, undone)."""
        link = self.link_into(op, port)
        if link is None:
            return self._refuse(f"{op}.{port} is not linked")
        return self.disconnect(*link.key)

    def rename(self, op: str, new: str) -> ActionResult:
        """Rename an operator (its links, preview references and position follow)."""
        if (problem := self.inner_problem(op)) is not None:
            return self._refuse(f"cannot rename: {problem}")
        if op not in self.adapter.operators():
            return self._refuse(f"unknown operator '{op}'")
        if not _NAME.match(new):
            return self._refuse(f"'{new}' is not a valid operator name (letters, digits, _ and -)")
        if new in self.adapter.operators():
            return self._refuse(f"cannot rename '{op}' to '{new}': that operator exists")
        return self._do(
            f"rename {op} to {new}",
            lambda doc: doc.rename_operator(op, new),
            lambda: self._rename(op, new),
            rename=(op, new),
        )

    def bypass(self, op: str, on: bool = True) -> ActionResult:
        """Bypass an operator (its readers read its input; no rebuild) or turn it back on."""
        if (problem := self.inner_problem(op)) is not None:
            return self._refuse(f"cannot bypass: {problem}")
        if op not in self.adapter.operators():
            return self._refuse(f"unknown operator '{op}'")
        if not hasattr(self.adapter, "set_bypass"):
            return self._refuse("this engine has no Bypass tier (HostAdapter.set_bypass)")
        if (op in self.doc.bypassed()) == on:
            return ActionResult(True, "unchanged")
        return self._do(
            f"{'bypass' if on else 'enable'} {op}",
            lambda doc: doc.set_bypassed(op, on),
            lambda: self._set_bypass(op, on),
        )

    def set_param(self, op: str, name: str, value: Any, *, live: bool = False) -> ActionResult:
        """Set a parameter (Hot for a scalar). ``live``: part of a drag; the drag's values make one
        edit, written to the file by ``end_live`` (the panel calls it when the widget is released).
        An inner parameter of an open composite that the composite exposes sets the composite's (the
        same value, the same tier); any other inner parameter is refused with the reason."""
        if "/" in op:
            target = self._exposed_param(op, name)
            if isinstance(target, str):
                return self._refuse(f"cannot set {op}.{name}: {target}")
            op, name = target
        try:
            block = self.adapter.block(op)
            self.adapter.set_param(op, name, value)
        except CudapatchError as exc:
            return self._refuse(str(exc))
        after = block.params[name].value if name in block.params else value
        if live:
            if self._live is None:
                self._live = _Edit(f"set {op}.{name}", self.doc.text, "")
            self.doc.set_param(op, name, after)
            self.version += 1
            return ActionResult(True, f"{op}.{name} = {after!r}")
        if self._live is not None:
            return self.end_live()
        edit = _Edit(f"set {op}.{name}", self.doc.text, "")
        self.doc.set_param(op, name, after)
        return self._finish(edit)

    def end_live(self) -> ActionResult:
        """End a drag: its values become one edit, written to the file."""
        if self._live is None:
            return ActionResult(True, "")
        edit, self._live = self._live, None
        return self._finish(edit)

    def move(self, op: str, x: float, y: float) -> ActionResult:
        """Store a node's position in the patch file (nothing changes in the engine)."""
        if "/" in op:
            return self.move_many({op: (x, y)})
        if op not in self.adapter.operators():
            return self._refuse(f"unknown operator '{op}'")
        return self._do(f"move {op}", lambda doc: doc.set_position(op, x, y), lambda: None)

    def move_many(self, positions: dict[str, tuple[float, float]], label: str | None = None) -> ActionResult:
        """Store several nodes' positions as one edit (a dragged selection or group: one undo). Inner nodes
        of open composites (``op/inner``) keep their place from their composite's node for this session
        only: the patch file has no place for them."""
        inner = {p: at for p, at in positions.items() if "/" in p}
        if inner:
            drawn = self.drawn_nodes()
            for p, (x, y) in inner.items():
                top = p.split("/", 1)[0]
                if p not in drawn:
                    return self._refuse(f"no node '{p}' (its composite is not open)")
                cx, cy = positions.get(top) or drawn[top].position
                self._offsets[p] = (x - cx, y - cy)
            positions = {op: at for op, at in positions.items() if "/" not in op}
            if not positions:
                self.version += 1
                self.status = f"moved inside {next(iter(inner)).split('/', 1)[0]} (inner places are not saved)"
                return ActionResult(True, self.status)
        unknown = [op for op in positions if op not in self.adapter.operators()]
        if unknown:
            return self._refuse(f"unknown operator '{unknown[0]}'")
        if not positions:
            return ActionResult(True, "unchanged")

        def edit(doc: PatchDocument) -> None:
            for op, (x, y) in positions.items():
                doc.set_position(op, x, y)

        if label is None:
            label = f"move {next(iter(positions))}" if len(positions) == 1 else f"move {len(positions)} nodes"
        return self._do(label, edit, lambda: None)

    def move_group(self, region: str, dx: float, dy: float) -> ActionResult:
        """Move region ``region`` with everything it holds (nested regions too) by ``(dx, dy)``, as one
        edit: what dragging its group does."""
        if not self.is_region(region):
            return self._refuse(f"'{region}' is not a region of this patch")
        views = self.nodes()
        ops = [region] + [op for op in views if self.holds(region, op)]
        moved = {op: (views[op].position[0] + dx, views[op].position[1] + dy) for op in ops}
        return self.move_many(moved, f"move {region} and the {len(ops) - 1} operators it holds")

    def place(self, op: str, region: str | None, *, position: tuple[float, float] | None = None) -> ActionResult:
        """Put ``op`` inside region ``region`` (an If, While or For of the patch: its body runs it), or at
        the top level with None; ``position``: where its node goes (into the region's group). One
        ``HostAdapter.place`` call (a rebuild), written to the file as ``region = "..."``."""
        if (problem := self.inner_problem(op)) is not None:
            return self._refuse(f"cannot move {op} into a region: {problem}")
        views = self.nodes()
        if op not in views:
            return self._refuse(f"unknown operator '{op}'")
        if region is not None:
            if region not in views:
                return self._refuse(f"cannot move {op} into '{region}': no such operator")
            if not views[region].kind:
                return self._refuse(
                    f"cannot move {op} into '{region}' ({views[region].type}): it is not an If, While or For"
                )
            if region == op or self.holds(op, region):
                return self._refuse(f"cannot move {op} into '{region}': a region cannot hold itself")
        current = views[op].region
        if current == region:
            return ActionResult(True, "unchanged")
        label = f"move {op} into {region}" if region is not None else f"move {op} out of {current}"

        def edit(doc: PatchDocument) -> None:
            doc.set_region(op, region)
            if position is not None:
                doc.set_position(op, *position)

        return self._do(label, edit, lambda: self.adapter.place(op, region))

    # -- undo / redo ----------------------------------------------------------------------------------------
    @property
    def can_undo(self) -> bool:
        return bool(self._undo)

    @property
    def can_redo(self) -> bool:
        return bool(self._redo)

    def undo(self) -> ActionResult:
        """Undo the last edit."""
        self.end_live()
        if not self._undo:
            return ActionResult(False, "nothing to undo")
        edit = self._undo.pop()
        result = self._restore(edit.before, edit.after, (edit.rename[1], edit.rename[0]) if edit.rename else None)
        if not result:
            self._undo.append(edit)
            return result
        self._redo.append(edit)
        self.status = f"undone: {edit.label}"
        return ActionResult(True, self.status)

    def redo(self) -> ActionResult:
        """Redo the last undone edit."""
        if not self._redo:
            return ActionResult(False, "nothing to redo")
        edit = self._redo.pop()
        result = self._restore(edit.after, edit.before, edit.rename)
        if not result:
            self._redo.append(edit)
            return result
        self._undo.append(edit)
        self.status = f"redone: {edit.label}"
        return ActionResult(True, self.status)

    def _restore(self, text: str, current_text: str, rename: tuple[str, str] | None) -> ActionResult:
        try:
            target = parse_patch(text, path=self.path, registry=self.registry)
            if rename is not None:
                self._rename(*rename)
            else:
                apply_patch(self.adapter, target, self.patch)
        except CudapatchError as exc:
            return self._refuse(f"cannot restore the patch: {exc}")
        self.doc = PatchDocument(text)  # apply_patch set the bypass flags as ``text`` lists them
        self._saved(target)
        return ActionResult(True, self.status)

    # -- internals ------------------------------------------------------------------------------------------
    def _do(
        self,
        label: str,
        edit_doc: Callable[[PatchDocument], None],
        run: Callable[[], Any],
        *,
        rename: tuple[str, str] | None = None,
    ) -> ActionResult:
        """Edit a copy of the document, check it parses, make the adapter call, then adopt and write."""
        self.end_live()
        before = self.doc.text
        doc = PatchDocument(before)
        try:
            edit_doc(doc)
            new = parse_patch(doc.text, path=self.path, registry=self.registry)
        except (CudapatchError, KeyError) as exc:
            return self._refuse(f"{label}: {exc}")
        try:
            run()
        except CudapatchError as exc:
            return self._refuse(f"{label}: {exc}")
        self.doc = doc
        self._push(_Edit(label, before, doc.text, rename))
        self._saved(new)
        self.status = label if not self.unsaved else self.status
        return ActionResult(True, label)

    def _finish(self, edit: _Edit) -> ActionResult:
        text = self.doc.text
        try:
            new = parse_patch(text, path=self.path, registry=self.registry)
        except PatchFileError as exc:  # the adapter took it, so the text should too: keep the running state
            log.error("editor: the edited patch does not parse: %s", exc)
            return self._refuse(str(exc))
        self._push(_Edit(edit.label, edit.before, text))
        self._saved(new)
        if not self.unsaved:
            self.status = edit.label
        return ActionResult(True, edit.label)

    def _push(self, edit: _Edit) -> None:
        if edit.before == edit.after:
            return
        self._undo.append(edit)
        if len(self._undo) > self.max_history:
            del self._undo[0]
        self._redo.clear()

    def _saved(self, new: Patch) -> None:
        """``new`` runs now: write it, and tell the watcher it is no change."""
        self.patch = new
        self._refused.clear()  # an edit landed: the marks of earlier refusals are stale
        self.version += 1
        if self.path is not None:
            try:
                _write_atomic(self.path, self.doc.text)
            except OSError as exc:
                self.unsaved = True
                self.status = f"cannot write {self.path} ({exc.strerror or exc}): the edit is kept in memory"
                log.warning("editor: %s", self.status)
            else:
                if self.unsaved:
                    log.info("editor: %s written, edits kept in memory are saved", self.path)
                self.unsaved = False
        if self._adopt is not None:
            self._adopt(new)

    def _sync_external(self) -> None:
        if self._current is None:
            return
        running = self._current()
        if running is self.patch:
            return
        # The reloader applied an edit made outside: the file is the truth again.
        self.patch = running
        self.doc = PatchDocument(running.text)
        self._undo.clear()
        self._redo.clear()
        self._live = None
        self._refused.clear()
        self.unsaved = False  # the reloader's apply_patch set the bypass flags as the file lists them
        self.version += 1
        self.status = "the patch file was edited outside: merged (undo history cleared)"

    def _set_bypass(self, op: str, on: bool) -> None:
        setter = getattr(self.adapter, "set_bypass", None)
        if setter is not None:
            setter(op, on)

    def _rename(self, old: str, new: str) -> None:
        self.adapter.rename(old, new)
        self.probes.renamed(old, new)  # a bypass flag stays on the block, whatever it is called
        if self._opened or self._offsets:  # an open composite stays open, its inner places stay
            self._opened = {_renamed(p, old, new) for p in self._opened}
            self._offsets = {_renamed(p, old, new): at for p, at in self._offsets.items()}

    def _exposed_param(self, name: str, param: str) -> tuple[str, str] | str:
        """``(composite operator, its parameter)`` that sets inner parameter ``param`` of inner node ``name``,
        or why it cannot be set here."""
        problem = self.inner_problem(name)
        view = self.drawn_nodes().get(name)
        top = name.split("/", 1)[0]
        outer = view.exposed.get(param, "") if view is not None else ""
        if view is not None and view.composite == top and outer.startswith(top + "."):
            return top, outer.split(".", 1)[1]
        return problem or f"no node '{name}'"

    def _refuse(self, message: str) -> ActionResult:
        self.status = message
        log.info("editor: %s", message)
        return ActionResult(False, message)


def source_text(block: Composite) -> str:
    """Where a composite's inside is defined, for messages: its file's name, or its Python class."""
    file = block.composite_file()
    if file:
        return file.replace("\\", "/").rsplit("/", 1)[-1]
    return f"Python class {type(block).__name__}"


def _renamed(path: str, old: str, new: str) -> str:
    """``path`` (an operator or ``op/inner``) after operator ``old`` was renamed ``new``."""
    top, sep, rest = path.partition("/")
    return f"{new}{sep}{rest}" if top == old else path


def _write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and a rename, so a program watching the file never reads half
    of it. A file marked read-only (no write bit: the user's choice, honoured for root too) or one
    the OS refuses raises before anything changes."""
    mode = path.stat().st_mode if path.exists() else None
    if mode is not None and not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(errno.EACCES, "the file is read-only", str(path))
    tmp = path.with_name(f".{path.name}.editor-tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        if mode is not None:
            os.chmod(tmp, stat.S_IMODE(mode))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
