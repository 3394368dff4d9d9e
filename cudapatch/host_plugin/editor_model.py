"""``EditorModel``: the node editor's view of a running patch and the actions that edit it.

The imgui panel (``interop/editor.py``) draws what this model says and calls only its actions; the
model knows nothing of imgui, so everything here is tested without a display or a GPU.

- **Views.** ``nodes()`` and ``links()`` describe the patch as the editor draws it: one node per
  operator with its ports as pins, its parameters with their declared types and ranges (``ParamView``
  picks the widget), its position, and, after ``refresh(stats)``, its state, diagnostic text, GPU
  time and append fill. Views are rebuilt only when an edit changed the patch (``version``); a frame
  with no edit costs one pass over the block statistics.
- **Actions** (``create``, ``delete``, ``connect``, ``disconnect``, ``rename``, ``bypass``,
  ``set_param``, ``move``) each make the one ``HostAdapter`` call that does it, so the engine applies
  it with the cheapest tier (a value is Hot, a link is Cold), then edit the patch file's text with
  ``PatchDocument`` (comments and order kept) and write it. An action the adapter or the patch checks
  refuse returns an ``ActionResult`` with the reason and changes nothing.
- **The file.** After writing, the host's ``PatchReloader`` adopts the new patch, so its watcher
  sees its own write as no change. A file that cannot be written (read-only) keeps the edit in
  memory; ``status`` says so and the next successful write saves it. An edit made outside (another
  editor) is applied by the reloader as before; the model then reads the file again and clears its
  history (its snapshots describe a file that no longer exists).
- **Probes.** ``probe(op, port)`` puts a probe on the wires leaving an output (``WireProbes``,
  ``engine.probe``); ``refresh`` takes their newest statistics into ``probes.latest`` each frame.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CudapatchError, PatchFileError
from .adapter import HostAdapter
from .patch import Patch, apply_patch, parse_patch
from .patch_writer import PatchDocument
from .wire_probes import WireProbes

__all__ = ["EditorModel", "ActionResult", "NodeView", "PinView", "ParamView", "LinkView", "auto_layout"]

log = logging.getLogger("cudapatch.editor")

_NAME = re.compile(r"^[A-Za-z_][\w-]*$")
# Vector parameters drawn as colour pickers: named or described as a colour (ToPoints' Young and Old
# are its particles' colours by age).
_COLOUR = re.compile(r"colou?r|tint|rgb|^young$|^old$", re.I)


@dataclass(frozen=True)
class ActionResult:
    """What an action did: ``ok``, and a ``message`` (the reason when refused)."""

    ok: bool
    message: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class PinView:
    """A port of a node: ``direction`` ``in``/``out``, element type text (``float[]``)."""

    op: str
    name: str
    direction: str
    type: str
    description: str = ""


@dataclass(frozen=True)
class ParamView:
    """A parameter and the widget that edits it.

    Attributes:
        widget: ``slider`` (number with a range), ``drag`` (number without one), ``checkbox`` (0/1
            integer), ``enum`` (``choices``), ``color`` (3 or 4 floats), ``vector``, ``code``
            (``Code``: multi-line), ``text``.
        lanes: Components (1 for scalars).
        integer: Whole numbers only.
    """

    name: str
    widget: str
    value: Any
    minimum: float | None
    maximum: float | None
    lanes: int = 1
    integer: bool = False
    structural: bool = False
    description: str = ""
    choices: tuple[str, ...] = ()


@dataclass
class NodeView:
    """One operator as the editor draws it (state fields follow ``refresh``)."""

    name: str
    type: str
    doc: str
    position: tuple[float, float]
    inputs: tuple[PinView, ...]
    outputs: tuple[PinView, ...]
    params: tuple[ParamView, ...]
    bypassed: bool = False
    block_id: int = -1
    state: str = "OK"
    message: str = ""
    gpu_ms: float | None = None
    append: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Compile errors of the Code parameter: (line, message), line 1-based.
    code_errors: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class LinkView:
    """A wire: its ends, element type, element count and bytes (None until the graph has the buffer)."""

    src: str
    src_port: str
    dst: str
    dst_port: str
    type: str = ""
    count: int | None = None
    nbytes: int | None = None
    shape: str = ""  # "1080x1920" for 2-D/3-D data, "" for flat data or before the graph has it

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.src, self.src_port, self.dst, self.dst_port)

    @property
    def size_text(self) -> str:
        """Shape, element type and bytes, for the wire's tooltip (``float4 1080x1920, 33,177,600 bytes``)."""
        if self.count is None:
            return f"{self.type}  not built yet"
        dims = f" {self.shape}" if self.shape else ""
        return f"{self.type}{dims}  {self.count:,} elements, {self.nbytes:,} bytes"

    def __str__(self) -> str:
        return f"{self.src}.{self.src_port} -> {self.dst}.{self.dst_port}"


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


def auto_layout(ops: list[str], links: list[tuple[str, str, str, str]]) -> dict[str, tuple[float, float]]:
    """Positions for operators that have none: columns by link depth (sources left), rows in order."""
    depth = dict.fromkeys(ops, 0)
    for _ in range(len(ops)):  # longest path by relaxation; a cycle (refused by the engine) just stops
        changed = False
        for src, _, dst, _ in links:
            if src in depth and dst in depth and depth[dst] < depth[src] + 1:
                depth[dst] = depth[src] + 1
                changed = True
        if not changed:
            break
    rows: dict[int, int] = {}
    out = {}
    for op in ops:
        d = depth[op]
        out[op] = (40.0 + 300.0 * d, 40.0 + 220.0 * rows.get(d, 0))
        rows[d] = rows.get(d, 0) + 1
    return out


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
        #: Whether the last write failed: the running patch has edits the file lacks.
        self.unsaved = False
        #: One line on the last action or write, for the panel's status bar.
        self.status = "ready"
        #: Bumped by every change of the patch; views are rebuilt when it moves.
        self.version = 0
        self._views: dict[str, NodeView] | None = None
        self._links: list[LinkView] | None = None
        self._views_version = -1
        self._bypassed: set[str] = set()  # operators this model bypassed through the adapter
        #: Probes on wires (``engine.probe``), by the output they read: selected wires show their statistics.
        self.probes = WireProbes(adapter)
        for op in self.doc.bypassed():  # the file's bypass flags take effect when the editor opens
            if op in adapter.operators():
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

    def port_text(self, op: str, port: str, direction: str) -> str:
        """A pin's tooltip: element type, shape and bytes of what it carries (an input: what its wire
        brings), then its description."""
        if direction == "out":
            view = self._link_view(op, port, "", "")
        else:
            view = next((lk for lk in self.links() if lk.dst == op and lk.dst_port == port), None)
            if view is None:
                spec = self.adapter.block(op).description.input(port)
                return f"{spec.pin_type if spec is not None else ''}  not linked" + (
                    f"\n{spec.description}" if spec is not None and spec.description else ""
                )
        spec = self.adapter.block(op).description
        p = spec.output(port) if direction == "out" else spec.input(port)
        about = f"\n{p.description}" if p is not None and p.description else ""
        return f"{op}.{port}\n{view.size_text}{about}"

    def _build_views(self) -> None:
        adapter = self.adapter
        ops = adapter.operators()
        link_keys = [(lk.src, lk.src_port, lk.dst, lk.dst_port) for lk in adapter.links()]
        stored = self.doc.positions()
        layout = auto_layout([op for op in ops if op not in stored], link_keys)
        bypassed = set(self.doc.bypassed())
        old = self._views or {}
        views: dict[str, NodeView] = {}
        for op, type_name in ops.items():
            block = adapter.block(op)
            desc = block.description
            bt = self.registry.get(type_name)
            view = NodeView(
                name=op,
                type=bt.name,
                doc=bt.doc,
                position=stored.get(op) or layout.get(op, (40.0, 40.0)),
                inputs=tuple(PinView(op, p.name, "in", str(p.pin_type), p.description) for p in desc.inputs),
                outputs=tuple(PinView(op, p.name, "out", str(p.pin_type), p.description) for p in desc.outputs),
                params=tuple(_param_view(spec, self._value(op, block, spec)) for spec in desc.params),
                bypassed=op in bypassed,
                block_id=block.id,
            )
            prev = old.get(op)
            if prev is not None:  # keep the last statistics until the next refresh
                view.state, view.message, view.gpu_ms, view.append = prev.state, prev.message, prev.gpu_ms, prev.append
                view.code_errors = prev.code_errors
            views[op] = view
        self._views = views
        self._links = [self._link_view(*key) for key in link_keys]
        self.probes.sync(views)
        self._views_version = self.version

    def _value(self, op: str, block: Any, spec: Any) -> Any:
        if spec.name in block.params:
            return block.params[spec.name].value
        spec_in_file = self.patch.operators.get(op)  # text parameters (Code, Path): as the file has them
        return spec_in_file.params.get(spec.name, spec.default) if spec_in_file is not None else spec.default

    def _link_view(self, src: str, src_port: str, dst: str, dst_port: str) -> LinkView:
        block = self.adapter.block(src)
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
        if stats is None:
            for view in views.values():
                diags = self.adapter.diagnostics(view.name)
                errors = [d for d in diags if d.severity == "error"]
                view.state = "Error" if errors else "Warning" if diags else "OK"
                view.message = "; ".join(d.message for d in diags)
                view.code_errors = _code_errors(view.message)
            return
        by_id = {b.block_id: b for b in stats.blocks}
        for view in views.values():
            b = by_id.get(view.block_id)
            if b is None:
                continue
            if b.message != view.message:
                view.code_errors = _code_errors(b.message)
            view.state, view.message, view.gpu_ms = b.state, b.message, b.gpu_ms
            view.append = {port: (a.count, a.capacity) for port, a in b.append.items()} if b.append else {}

    def probe(self, op: str, port: str) -> ActionResult:
        """Probe the wires leaving output ``port`` of ``op``: their statistics come in ``probes.latest``
        from the next frames on (not an edit of the patch: nothing is written or undone)."""
        if op not in self.nodes():
            return self._refuse(f"unknown operator '{op}'")
        problem = self.probes.add(op, port)
        if problem is not None:
            return self._refuse(f"cannot probe {op}.{port}: {problem}")
        return ActionResult(True, f"probing {op}.{port}")

    def unprobe(self, op: str, port: str) -> ActionResult:
        """Remove the probe on ``op.port``."""
        if not self.probes.remove(op, port):
            return ActionResult(False, f"{op}.{port} is not probed")
        return ActionResult(True, f"probe on {op}.{port} removed")

    def link_problem(self, src: str, src_port: str, dst: str, dst_port: str) -> str | None:
        """Why a wire from ``src.src_port`` to ``dst.dst_port`` would be refused, checked without
        changing anything (element types, an input already linked, a link to itself); None when it
        looks fine (the engine still has the last word, e.g. on cycles)."""
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

    # -- actions --------------------------------------------------------------------------------------
    def create(
        self,
        type_name: str,
        name: str | None = None,
        *,
        position: tuple[float, float] | None = None,
        params: dict[str, Any] | None = None,
    ) -> ActionResult:
        """Create an operator of ``type_name`` (default name: the type's, numbered)."""
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

        def edit(doc: PatchDocument) -> None:
            doc.add_operator(name, bt.name, params)
            if position is not None:
                doc.set_position(name, *position)

        return self._do(f"create {name}", edit, lambda: self.adapter.create(name, bt.name, params))

    def delete(self, op: str) -> ActionResult:
        """Delete an operator and its links."""
        if op not in self.adapter.operators():
            return self._refuse(f"unknown operator '{op}'")
        return self._do(f"delete {op}", lambda doc: doc.remove_operator(op), lambda: self.adapter.delete(op))

    def connect(self, src: str, src_port: str, dst: str, dst_port: str) -> ActionResult:
        """Link ``src.src_port`` to ``dst.dst_port``; refused with the reason when the pins do not fit."""
        problem = self.link_problem(src, src_port, dst, dst_port)
        if problem is not None:
            return self._refuse(f"cannot link {src}.{src_port} -> {dst}.{dst_port}: {problem}")
        text = f"{src}.{src_port} -> {dst}.{dst_port}"
        return self._do(
            f"link {text}", lambda doc: doc.add_link(text), lambda: self.adapter.connect(src, src_port, dst, dst_port)
        )

    def disconnect(self, src: str, src_port: str, dst: str, dst_port: str) -> ActionResult:
        """Remove a link."""
        key = (src, src_port, dst, dst_port)
        if key not in {(lk.src, lk.src_port, lk.dst, lk.dst_port) for lk in self.adapter.links()}:
            return self._refuse(f"no link {src}.{src_port} -> {dst}.{dst_port}")
        text = f"{src}.{src_port} -> {dst}.{dst_port}"
        return self._do(f"unlink {text}", lambda doc: doc.remove_link(text), lambda: self.adapter.disconnect(*key))

    def rename(self, op: str, new: str) -> ActionResult:
        """Rename an operator (its links, preview references and position follow)."""
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
        edit, written to the file by ``end_live`` (the panel calls it when the widget is released)."""
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
        if op not in self.adapter.operators():
            return self._refuse(f"unknown operator '{op}'")
        return self._do(f"move {op}", lambda doc: doc.set_position(op, x, y), lambda: None)

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
        if result:
            self._redo.append(edit)
            self.status = f"undone: {edit.label}"
        else:
            self._undo.append(edit)
        return result

    def redo(self) -> ActionResult:
        """Redo the last undone edit."""
        if not self._redo:
            return ActionResult(False, "nothing to redo")
        edit = self._redo.pop()
        result = self._restore(edit.after, edit.before, edit.rename)
        if result:
            self._undo.append(edit)
            self.status = f"redone: {edit.label}"
        else:
            self._redo.append(edit)
        return result

    def _restore(self, text: str, current_text: str, rename: tuple[str, str] | None) -> ActionResult:
        try:
            target = parse_patch(text, path=self.path, registry=self.registry)
            if rename is not None:
                self._rename(*rename)
            else:
                apply_patch(self.adapter, target, self.patch)
        except CudapatchError as exc:
            return self._refuse(f"cannot restore the patch: {exc}")
        self.doc = PatchDocument(text)
        self._sync_bypass()
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
        self.unsaved = False
        self._sync_bypass()
        self.version += 1
        self.status = "the patch file was edited outside: merged (undo history cleared)"

    def _set_bypass(self, op: str, on: bool) -> None:
        setter = getattr(self.adapter, "set_bypass", None)
        if setter is not None:
            setter(op, on)
            (self._bypassed.add if on else self._bypassed.discard)(op)

    def _rename(self, old: str, new: str) -> None:
        self.adapter.rename(old, new)
        self.probes.renamed(old, new)
        if old in self._bypassed:  # the flag stays on the block; the name it goes by changed
            self._bypassed.discard(old)
            self._bypassed.add(new)

    def _sync_bypass(self) -> None:
        """Make the adapter's bypass flags match the document's (after undo, redo, an outside edit)."""
        wanted = set(self.doc.bypassed())
        for op in self.adapter.operators():
            if (op in self._bypassed) != (op in wanted):
                self._set_bypass(op, op in wanted)
        self._bypassed &= set(self.adapter.operators())

    def _refuse(self, message: str) -> ActionResult:
        self.status = message
        log.info("editor: %s", message)
        return ActionResult(False, message)


def _param_view(spec: Any, value: Any) -> ParamView:
    choices = tuple(getattr(spec, "choices", ()) or ())
    if spec.kind == "text":
        return ParamView(
            spec.name, "code" if spec.name == "Code" else "text", value, None, None, description=spec.description
        )
    dtype = spec.dtype
    integer = dtype.base.kind in "iu"
    lanes = dtype.lanes
    if choices:
        widget = "enum"
    elif lanes in (3, 4) and not integer and (_COLOUR.search(spec.name) or _COLOUR.search(spec.description)):
        widget = "color"
    elif lanes > 1:
        widget = "vector"
    elif integer and spec.minimum == 0 and spec.maximum == 1:
        widget = "checkbox"
    elif spec.minimum is not None and spec.maximum is not None:
        widget = "slider"
    else:
        widget = "drag"
    return ParamView(
        spec.name, widget, value, spec.minimum, spec.maximum, lanes, integer, spec.structural, spec.description, choices
    )


# NVRTC logs "<name>(LINE): error: ..." ; the messages on a block carry the log.
_CODE_ERROR = re.compile(r"\((\d+)\):\s*(error|warning)[^:]*:\s*(.+)")


def _code_errors(message: str) -> tuple[tuple[int, str], ...]:
    """Compiler errors in a block's message as (line, text), for the Code editor's markers."""
    if not message:
        return ()
    return tuple((int(m.group(1)), f"{m.group(2)}: {m.group(3).strip()}") for m in _CODE_ERROR.finditer(message))


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
