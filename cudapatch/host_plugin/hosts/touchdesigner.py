"""TouchDesigner binding, written against TouchDesigner's documented Python API.

Set-up (see ``examples/touchdesigner/README.md``): one ``TouchDesignerHost`` per project (in a
Text DAT module), a Base COMP per block whose extension is a ``BlockOperatorExt``, and one Script TOP
whose callbacks DAT forwards ``onSetupParameters``/``onCook`` to an ``EngineTOP``.

API used (TouchDesigner 2023.11+):
- ``COMP.appendCustomPage(name)`` → ``Page``; ``Page.appendFloat/appendInt/appendStr(name, label=, size=)``
  → a ``ParGroup``-like list of ``Par``; ``Par.name``, ``Par.val``, ``Par.eval()``, ``Par.normMin/normMax``,
  ``Par.default``; ``COMP.par.<Name>``; ``COMP.path``; custom parameter names are a capital letter
  followed by lower-case letters and digits.
- ``Page.appendMenu(name, label=)``: a menu parameter (a parameter with choices); ``Par.menuNames`` /
  ``Par.menuLabels`` its entries; its ``eval()`` is the current entry's name.
- ``scriptTOP.copyCUDAMemory(address, size, shape, stream=None)``: copy device memory into the TOP
  on that CUDA stream (``shape``: ``CUDAMemoryShape`` with ``width``, ``height``, ``numComps``,
  ``dataType``; uint8 4-component data is BGRA).
- ``TOP.cudaMemory(stream=None)`` → ``CUDAMemory`` (``ptr``, ``size``, ``shape``): the memory stays
  valid only while that object is alive, so the binding holds it for as long as the engine uses it
  (dropping it early is a known cause of crashes in community components).
- ``OP.addError(msg)``, ``OP.addWarning(msg)``: shown on the operator for this cook.
- ``OP.bypass``: the operator's Bypass flag; an OP Execute DAT's ``onFlagChange(changeOp, flag)``
  reports its changes (forwarded to ``BlockOperatorExt.OnFlagChange``).

Nothing here imports ``td``: the TouchDesigner objects are passed in, so the module is importable
(and testable) outside TouchDesigner.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from ...blocks.composite import Composite
from ...blocks.description import ParamSpec
from ...blocks.regions import Region
from ...engine.bindings import DeviceArray
from ...errors import CudapatchError
from ..adapter import HostAdapter
from ..manager import PluginHost

__all__ = ["TouchDesignerHost", "BlockOperatorExt", "EngineTOP", "td_par_name"]

log = logging.getLogger("cudapatch.touchdesigner")
PAGE = "cudapatch"


def td_par_name(name: str) -> str:
    """A block parameter name as a TouchDesigner custom parameter name (``CurlScale`` → ``Curlscale``)."""
    clean = re.sub(r"[^A-Za-z0-9]", "", name) or "Par"
    return clean[0].upper() + clean[1:].lower()


class TouchDesignerHost:
    """The per-project state: plugins, one engine, the adapter. Create it once (in a module DAT).

    Args:
        device: CUDA device ordinal (TouchDesigner's GPU).
        plugins: Plugin host (default: built-ins and installed plugins).
        engine: An engine to use (default: a new one on ``device``).
        isolated: Run the engine in a child process (``Engine(isolated=True)``): a GPU fault in a
            block ends only that process, TouchDesigner and its own CUDA work keep running, and the
            engine comes back without the faulting block. Outputs reach TouchDesigner with no copy
            through CUDA IPC; ``EngineTOP`` copies them on the host's engine stream, which waits on
            the GPU for each frame of the child. The child's Python is ``CUDAPATCH_COMPILER_PYTHON``
            (TouchDesigner's ``sys.executable`` is not a Python).
        fuse: Elementwise fusion (``Engine(fuse=...)``, on by default). An output an ``EngineTOP`` shows
            is kept out of fused groups from the start (``Engine.keep``).
        project_folder: The .toe's folder (TouchDesigner's ``project.folder``): a relative file parameter
            (a composite's or kernel file's ``Path``) is found there first, as TouchDesigner finds its own
            file parameters, then in the plugins' kernel search paths.
    """

    def __init__(
        self,
        *,
        device: int = 0,
        plugins: PluginHost | None = None,
        engine: Any = None,
        isolated: bool = False,
        fuse: bool = True,
        project_folder: str | Path | None = None,
    ) -> None:
        self.plugins = plugins or PluginHost()
        if engine is None:
            from ...engine.engine import Engine

            engine = Engine(device, name="TouchDesigner", isolated=isolated, fuse=fuse)
        self.engine = engine
        search = [Path(project_folder)] if project_folder else []
        search += self.plugins.kernel_search_paths()
        self.adapter = HostAdapter(engine, self.plugins.registry, search_paths=search)
        self.plugins.engine_started(engine)

    def block_type_for(self, operator: Any, default: str | None = None) -> str:
        """The block type for a host operator: the first plugin that adapts it
        (``cudapatch_adapt_operator(host="touchdesigner", operator=...)``), else ``default``.

        Raises:
            CudapatchError: no plugin adapts it and there is no default.
        """
        spec = self.plugins.adapt_operator("touchdesigner", operator)
        if spec is not None:
            return str(spec["type"])
        if default is None:
            raise CudapatchError(f"no plugin knows which block operator '{getattr(operator, 'path', operator)}' is")
        return default

    def close(self) -> None:
        self.plugins.engine_stopping(self.engine)
        self.adapter.close_rings()  # before the engine: their frees wait for frames still running
        self.engine.close()


class BlockOperatorExt:
    """Extension of a Base COMP that stands for one block.

    Creating it creates the block (operator id: the COMP's path) and a custom parameter page with
    one parameter per block parameter. A COMP that already has that page (a saved project, a
    re-initialized extension) keeps its values: the block is made with them. A block COMP inside a
    region COMP (If, While, For) runs in the region's body. Forward ``onValueChange`` of a Parameter
    Execute DAT to ``OnParValueChange``, and call ``Link``/``Unlink`` when the network's wires change.

    A text parameter that changes the block's parameters (a composite's ``Path``, a ``CustomKernel``'s
    ``Code`` whose kernel takes other scalars) rebuilds the page: parameters that still exist keep
    their values, new ones appear with the block's values, gone ones are removed.

    Args:
        ownerComp: The COMP.
        host: The project's ``TouchDesignerHost``.
        block_type: Qualified block type (``particles.Emitter``); None asks the plugins
            (``cudapatch_adapt_operator``).
    """

    def __init__(self, ownerComp: Any, host: TouchDesignerHost, block_type: str | None = None) -> None:
        self.ownerComp = ownerComp
        self.host = host
        self.op_id = ownerComp.path
        self._par_to_param: dict[str, tuple[str, int]] = {}  # TD par name -> (block param, component)
        saved = self._saved_values()
        self.block = self._create(host.block_type_for(ownerComp, block_type), saved)
        for name, value in saved.items():  # numbers after the texts that shaped the block
            p = self.block.params.get(name)
            if p is not None and p.spec.kind != "text":
                try:
                    host.adapter.set_param(self.op_id, name, value)
                except CudapatchError as exc:
                    ownerComp.addError(str(exc))
        self.SyncPage()
        if getattr(ownerComp, "bypass", False) is True:  # created bypassed
            host.adapter.set_bypass(self.op_id, True)
        self._place_by_path()

    def _page(self) -> Any:
        comp = self.ownerComp
        return next((p for p in comp.customPages if p.name == PAGE), None) or comp.appendCustomPage(PAGE)

    def _saved_values(self) -> dict[str, Any]:
        """Block parameter → value held by the COMP's page from before (its parameters' labels are the
        block parameter names; a vector's components make a tuple)."""
        page = next((p for p in self.ownerComp.customPages if p.name == PAGE), None)
        grouped: dict[str, list[Any]] = {}
        for par in page.pars if page is not None else ():
            grouped.setdefault(par.label, []).append(par.eval())
        return {name: vals[0] if len(vals) == 1 else tuple(vals) for name, vals in grouped.items()}

    def _create(self, type_name: str, saved: dict[str, Any]) -> Any:
        """The block, made with the saved text values (a composite's ``Path`` decides its parameters).
        Texts it refuses (a file since moved) are an error on the COMP; the block is made without them
        and the page keeps showing them, for the user to fix."""
        adapter = self.host.adapter
        bt = adapter.registry.get(type_name)
        texts = {k: v for k, v in saved.items() if isinstance(v, str) and v}
        if bt.params and not issubclass(bt.cls, Composite):  # a page of another type (Blocktype changed)
            texts = {k: v for k, v in texts.items() if any(n == k and kind == "text" for n, kind, _ in bt.params)}
        if texts:
            try:
                return adapter.create(self.op_id, type_name, texts)
            except CudapatchError as exc:
                self.ownerComp.addError(str(exc))
        return adapter.create(self.op_id, type_name)

    def _place_by_path(self) -> None:
        """A block COMP directly inside a region COMP (``core.If``, ``core.While``, ``core.For``) runs
        in that region's body: the network's nesting is the patch's (by operator path, so whichever
        of the two COMPs TouchDesigner initializes first, the placement is made). A placement the
        engine refuses is an error on the COMP."""
        adapter = self.host.adapter
        ops = adapter.operators()
        parent = self.op_id.rsplit("/", 1)[0]
        pairs = [(self.op_id, parent)] if parent in ops and isinstance(adapter.block(parent), Region) else []
        if isinstance(self.block, Region):
            pairs += [(c, self.op_id) for c in ops if c != self.op_id and c.rsplit("/", 1)[0] == self.op_id]
        for child, region in pairs:
            try:
                adapter.place(child, region)
            except CudapatchError as exc:
                self.ownerComp.addError(str(exc))

    def SyncPage(self) -> None:
        """Make the custom page show the block's parameters, in the block's order: page parameters of
        the right kind and size stay (a text keeps what the user typed, a number shows the block's
        value, which kept its value across the change), new ones are made with the block's values,
        gone ones are destroyed. Called at creation and after a text
        parameter changed the block's parameters; call it after anything else did (a re-read
        composite file)."""
        page = self._page()
        self._par_to_param = {}
        order: list[Any] = []
        for spec in self.block.description.params:
            pars = self._existing(spec)
            kept = pars is not None
            if pars is None:  # new, or its name is taken by one of another kind: replaced (``replace=True``)
                pars = self._append(page, spec)
            value = self.block.params[spec.name].value
            values = value if isinstance(value, tuple) else (value,)
            if spec.choices:  # a menu of the choices' names: eval() gives a name, which set_param takes
                pars[0].menuNames = pars[0].menuLabels = [str(c) for c in spec.choices]
                values = (str(value),)
            default = spec.default if isinstance(spec.default, tuple) else (spec.default,)
            default = (str(spec.default),) if spec.choices else default
            for i, par in enumerate(pars):
                par.default = default[i]
                # A kept text shows what the user typed (a relative Path the block holds resolved).
                if (not kept or spec.kind != "text") and par.val != values[i]:
                    par.val = values[i]
                if spec.minimum is not None:
                    par.normMin = spec.minimum
                if spec.maximum is not None:
                    par.normMax = spec.maximum
                self._par_to_param[par.name] = (spec.name, i)
            order += pars
        names = set(self._par_to_param)
        for par in [par for par in page.pars if par.name not in names]:  # gone parameters, stale ones of a saved page
            par.destroy()
        for i, par in enumerate(order):
            if par.order != i:
                par.order = i

    def _existing(self, spec: ParamSpec) -> list[Any] | None:
        """The page parameters already made for a parameter of ``spec``'s kind and size, or None."""
        base = td_par_name(spec.name)
        lanes = 1 if spec.kind == "text" else spec.dtype.lanes
        style = "Str" if spec.kind == "text" else "Int" if spec.dtype.base.kind in "iu" else "Float"
        style = "Menu" if spec.choices else style
        names = [base] if lanes == 1 else [f"{base}{i + 1}" for i in range(lanes)]
        pars = [getattr(self.ownerComp.par, n, None) for n in names]
        return pars if all(p is not None and p.style == style for p in pars) else None

    @staticmethod
    def _append(page: Any, spec: ParamSpec) -> list[Any]:
        base = td_par_name(spec.name)
        if spec.choices:
            return list(page.appendMenu(base, label=spec.name))
        if spec.kind == "text":
            return list(page.appendStr(base, label=spec.name))
        if spec.dtype.base.kind in "iu":
            return list(page.appendInt(base, label=spec.name, size=spec.dtype.lanes))
        return list(page.appendFloat(base, label=spec.name, size=spec.dtype.lanes))

    def OnParValueChange(self, par: Any, prev: Any = None) -> None:
        """Forward a custom parameter change to the block (vector parameters: the whole tuple).

        A bad value is reported on the COMP with ``addError`` and the block keeps its old value. A text
        change that changes the block's parameters rebuilds the page (``SyncPage``)."""
        target = self._par_to_param.get(par.name)
        if target is None:
            return
        name, _ = target
        spec = self.block.description.param(name)
        if spec is not None and spec.kind != "text" and spec.dtype.lanes > 1:
            value: Any = tuple(
                getattr(self.ownerComp.par, p).eval() for p, (n, _) in self._par_to_param.items() if n == name
            )
        else:
            value = par.eval()
        before = self.block.description.params
        try:
            self.host.adapter.set_param(self.op_id, name, value)
        except CudapatchError as exc:
            self.ownerComp.addError(str(exc))
            par.val = prev if prev is not None else par.val
            return
        if self.block.description.params != before:
            self.SyncPage()

    def OnFlagChange(self, flag: str = "bypass") -> None:
        """Forward the COMP's Bypass flag to the block (call from an OP Execute DAT's ``onFlagChange``):
        a bypassed block's kernels are turned off without a rebuild and its readers read its input."""
        if flag == "bypass":
            self.host.adapter.set_bypass(self.op_id, bool(self.ownerComp.bypass))

    def Link(self, src_ext: BlockOperatorExt, src_port: str, dst_port: str) -> None:
        """Link ``src_ext``'s output ``src_port`` to this block's input ``dst_port``."""
        try:
            self.host.adapter.connect(src_ext.op_id, src_port, self.op_id, dst_port)
        except CudapatchError as exc:
            self.ownerComp.addError(str(exc))

    def Unlink(self, src_ext: BlockOperatorExt, src_port: str, dst_port: str) -> None:
        self.host.adapter.disconnect(src_ext.op_id, src_port, self.op_id, dst_port)

    def Upload(self, values: Any) -> bool:
        """Feed this block, a ``core.Upload``, for the next cook: ``values`` is a NumPy array (a CHOP's
        ``numpyArray()``, a sensor frame) of the block's ``Count`` elements and ``Type`` (a CHOP gives
        float32: ``Type`` float; channels x samples are taken in that order). Never waits: returns
        False when the write was dropped (the GPU still reads the slot it needs) or refused (the error
        is shown on the COMP). Call it every frame, before the engine TOP cooks.
        """
        try:
            return self.host.adapter.upload(self.op_id, np.ascontiguousarray(values))
        except CudapatchError as exc:
            self.ownerComp.addError(str(exc))
            return False

    def Download(self) -> np.ndarray | None:
        """The newest values this block, a ``core.Download``, copied in a completed frame (a frame or two
        old; for a Script CHOP's ``copyNumpyArray``, say), or None before its first frame completes.
        Never waits. A refusal (not a Download) is shown on the COMP and gives None."""
        try:
            return self.host.adapter.download(self.op_id)
        except CudapatchError as exc:
            self.ownerComp.addError(str(exc))
            return None

    def Tooltip(self) -> str:
        """The block's state line for the COMP's info (``str(block)``)."""
        return self.host.adapter.tooltip(self.op_id)

    def Dispose(self) -> None:
        """Call from the COMP's onDestroy: removes the block and its links."""
        self.host.adapter.delete(self.op_id)


class EngineTOP:
    """Callbacks of the Script TOP that runs the engine and shows one output.

    Args:
        host: The project's host.
        output: ``(operator path, port)`` shown in the TOP.
        shape: A ``CUDAMemoryShape`` describing that output (``width``, ``height``, ``numComps``, ``dataType``).
    """

    def __init__(self, host: TouchDesignerHost, output: tuple[str, str], shape: Any) -> None:
        self.host = host
        self.output = output
        self.shape = shape
        self._kept = False
        self._keep_output()
        #: Bytes the TOP takes per cook (the shape is fixed: computed once, not per frame).
        self.nbytes = int(shape.width * shape.height * shape.numComps * np.dtype(shape.dataType).itemsize)
        self._held: dict[tuple[str, str], Any] = {}  # CUDAMemory objects the engine reads from

    def _keep_output(self) -> None:
        """Keep the shown output in a buffer of its own (``Engine.keep``) once its operator exists: read
        after every cook, it is never fused away or shared, from the first build on."""
        keep = getattr(self.host.engine, "keep", None)
        op, port = self.output
        if keep is None or op not in self.host.adapter.operators():
            return
        keep(self.host.adapter.block(op), port)
        self._kept = True

    @property
    def stream(self) -> int:
        """The engine's CUDA stream as the integer TouchDesigner's ``stream=`` arguments take."""
        return int(self.host.engine.device.stream_handle)

    def BindInputTOP(self, op_id: str, port: str, top: Any) -> None:
        """Feed a TOP's texture memory to a block input, with no copy.

        The ``CUDAMemory`` object is held until the next bind of that input (or ``close``), so its
        memory stays valid for every frame that reads it."""
        mem = top.cudaMemory(stream=self.stream)
        block = self.host.adapter.block(op_id)
        spec = block.description.input(port)
        if spec is None:
            raise CudapatchError("no such input", block=op_id, port=port)
        count = mem.size // spec.dtype.itemsize
        self.host.engine.bind(block, port, DeviceArray(mem.ptr, count, spec.dtype), dtype=spec.dtype)
        self._held[(op_id, port)] = mem  # replaces (and so releases) the previous frame's object

    def onCook(self, scriptOp: Any) -> None:
        """Cook the engine operator, then copy the output into the TOP on the engine's stream."""
        eo = self.host.adapter.engine_operator
        try:
            if not self._kept:  # its operator was created after this TOP
                self._keep_output()
            eo.cook()
            lost = getattr(self.host.engine, "lost", None)
            if lost is not None:  # CUDA refuses this process after a GPU fault: nothing left to copy
                scriptOp.addError(f"engine: {lost}")
                return
            buf = eo.output(*self.output)
        except CudapatchError as exc:
            scriptOp.addError(str(exc))
            return
        need = self.nbytes
        if buf.nbytes < need:
            scriptOp.addError(
                f"output '{self.output[0]}.{self.output[1]}' has {buf.nbytes} bytes; the TOP shape needs {need}"
            )
            return
        scriptOp.copyCUDAMemory(buf.ptr, need, self.shape, stream=self.stream)
        for op_id, diags in eo.diagnostics().items():
            for d in diags:
                (scriptOp.addError if d.severity == "error" else scriptOp.addWarning)(
                    f"{op_id or 'engine'}: {d.message}"
                )

    def close(self) -> None:
        self._held.clear()
