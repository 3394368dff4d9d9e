"""Block: the passive base class every block type derives from.

A block only *describes* GPU work: ``describe(builder)`` adds kernels, ports and scalars. It never
launches anything; the engine it is registered with compiles all blocks into one graph. The block
knows that engine only as a ``BlockHost`` (``blocks/host.py``), through which it reports the edits
only it sees; the host attaches and detaches it with ``attach``/``detach``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import CudapatchError, ParameterError
from .builder import BlockBuilder
from .description import BlockDescription, KernelSpec, PortSpec
from .parameter import BlockParameter

if TYPE_CHECKING:
    from ..kernels.source import KernelSource
    from .host import BlockHost, ParamListener

__all__ = ["Block", "BlockState", "BlockDebugInfo", "PortHandle"]

_ids = itertools.count(1)


class BlockState(Enum):
    """What the engine last made of a block."""

    NOT_COMPILED = "NotCompiled"
    OK = "OK"
    WARNING = "Warning"
    ERROR = "Error"


@dataclass
class BlockDebugInfo:
    """Debug data the engine writes onto a block; ``str(block)`` reads only this.

    ``sizes`` (output port -> element count), ``shapes`` (output port -> Shape, for 2-D/3-D outputs)
    and ``fused`` (the fused group this block runs in, "a -> b -> c", empty when it runs alone) are
    read from the build an engine shows (``engine.built_view.BuiltShower``) once the engine has shown
    one with this block, so a build that changes every block's sizes writes nothing per block;
    setting one of them stops that (the block then shows what was set).
    """

    state: BlockState = BlockState.NOT_COMPILED
    message: str = ""
    append: dict[str, Any] = field(default_factory=dict)  # port -> live AppendBuffer (count, capacity, age)
    gpu_ms: float | None = None  # GPU time in the last reported frame (PerBlock and above)
    runs: tuple[int, float | None, float | None] | None = None  # in a region's body: (runs, min ms, max ms)
    append_fill: dict[str, tuple[int, int]] = field(default_factory=dict)  # port -> (count, capacity), Deep levels
    _sizes: dict[str, int] = field(default_factory=dict, repr=False)
    _shapes: dict[str, Any] = field(default_factory=dict, repr=False)
    _fused: str = field(default="", repr=False)
    #: ``(shower, block id)`` while sizes, shapes and fused are read from a ``BuiltShower``'s view.
    _shown_by: Any = field(default=None, repr=False, compare=False)

    @property
    def sizes(self) -> dict[str, int]:
        src = self._shown_by
        return self._sizes if src is None else src[0].sizes_of(src[1])

    @sizes.setter
    def sizes(self, value: dict[str, int]) -> None:
        self.detach()
        self._sizes = value

    @property
    def shapes(self) -> dict[str, Any]:
        src = self._shown_by
        return self._shapes if src is None else src[0].shapes_of(src[1])

    @shapes.setter
    def shapes(self, value: dict[str, Any]) -> None:
        self.detach()
        self._shapes = value

    @property
    def fused(self) -> str:
        src = self._shown_by
        return self._fused if src is None else src[0].fused_of(src[1])

    @fused.setter
    def fused(self, value: str) -> None:
        self.detach()
        self._fused = value

    def show_from(self, shower: Any, block_id: int) -> None:
        """Read sizes, shapes and fused from ``shower`` (``BuiltShower.sizes_of`` ...) from now on."""
        src = self._shown_by
        if src is not None and src[0] is not shower:  # moved from another engine: it must attach the block again
            src[0].detached(src[1])
        self._shown_by = (shower, block_id)

    def detach(self) -> None:
        """Keep what the shower shows now as this block's own values, and stop reading from it."""
        src = self._shown_by
        if src is not None:
            shower, bid = src
            self._sizes, self._shapes, self._fused = shower.sizes_of(bid), shower.shapes_of(bid), shower.fused_of(bid)
            self._shown_by = None
            shower.detached(bid)


class Block:
    """Base class of block types. Subclasses set ``type_name`` and implement ``describe``.

    Args:
        name: Instance name (defaults to ``TypeName<id>``).
        **params: Initial parameter values (checked like ``set``); strings set text parameters.

    Raises:
        KernelLoadError: a kernel file is missing or invalid.
        ParameterError: an initial value is invalid.
    """

    type_name: ClassVar[str] = "Block"
    internal: ClassVar[bool] = False  # added by cudapatch itself (a preview's GL writers): shown apart, dimmed
    kernel_dir: ClassVar[Path | None] = None  # base for relative kernel paths

    def __init__(self, *, name: str | None = None, **params: Any) -> None:
        self.id: int = next(_ids)
        self._host: BlockHost | None = None
        self.name = name or f"{self.type_name}{self.id}"
        self.debug = BlockDebugInfo()
        self._enabled = True
        self._listener: ParamListener | None = None  # the host's, subscribed to every scalar parameter
        # Text parameters feed describe() itself, so string values given here are known before it runs.
        self._texts: dict[str, str] = {k: v for k, v in params.items() if isinstance(v, str)}
        self.params: dict[str, BlockParameter] = {}
        self.description = self._describe()
        self._make_params({})
        for key, value in params.items():
            p = self.params.get(key)
            if p is not None and p.spec.kind == "text" and key in self._texts:
                # describe() built from it already: the parameter takes it without a second description
                # (half of a CustomKernel's or an Expression's construction, a host's hot swap)
                p.set(value)
                self._texts[key] = p.value
            else:
                self.set(key, value)

    @property
    def name(self) -> str:
        """Instance name (unique in its engine). Assigning it (a host's rename) tells the host."""
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = value
        if self._host is not None:
            self._host.on_snapshot_stale(self)

    @property
    def description(self) -> BlockDescription:
        """What ``describe`` built (ports, parameters, kernels). Assigning it tells the host."""
        return self._description

    @description.setter
    def description(self, value: BlockDescription) -> None:
        self._description = value
        if self._host is not None:
            self._host.on_snapshot_stale(self)

    def describe(self, b: BlockBuilder) -> None:
        """Describe the block's GPU work with ``b``. Called at construction and on ``refresh()``."""
        raise NotImplementedError(f"{type(self).__name__}.describe")

    def _describe(self) -> BlockDescription:
        b = BlockBuilder(self.type_name, self.name, base_dir=self.kernel_dir, texts=self._texts)
        self.describe(b)
        return b.commit()

    def _make_params(self, old: dict[str, BlockParameter]) -> None:
        params = {}
        for spec in self.description.params:
            p = BlockParameter(spec, self.name)
            prev = old.get(spec.name)
            if prev is not None:
                try:
                    p.set(prev.value)  # keep the user's value across re-descriptions (no listener yet: silent)
                except ParameterError:
                    pass
            if self._listener is not None and spec.kind == "scalar":
                p.subscribe(self._listener)
            params[spec.name] = p
        self.params = params

    # -- parameters ---------------------------------------------------------------------------
    def set(self, name: str, value: Any) -> None:
        """Set parameter ``name``; the engine applies it on its next update (Hot, or Cold if structural).

        Raises:
            ParameterError: unknown parameter, wrong type, out of range or not one of the parameter's
                choices (the old value stays).
        """
        p = self.params.get(name)
        if p is None:
            known = ", ".join(self.params) or "none"
            raise ParameterError(f"unknown parameter (this block has: {known})", block=self.name, param=name)
        if p.spec.kind == "text":
            self._set_text(p, value)
        else:
            p.set(value)

    def text_source(self, name: str, text: str) -> tuple[int, KernelSource] | None:
        """For a text parameter that holds nothing but one kernel's code: that kernel's index and
        the source ``text`` makes. An edit whose kernel keeps its descriptor (so every port stays)
        then goes to the engine as new code without re-describing the block: half of a
        re-description's host time, and the edit runs on a host's frame thread. None (the default):
        the text may change anything, so every edit re-describes the block."""
        return None

    def _set_text(self, p: BlockParameter, value: Any) -> None:
        text = p.validate(value)
        if text == p.value:
            return
        if self._host is not None and self._swap_source(p, text):
            return
        old = self._texts.get(p.name)
        self._texts[p.name] = text  # type: ignore[assignment]
        try:
            self.refresh()  # Code tier if only kernel code changed, else a rebuild
        except Exception:
            if old is None:
                self._texts.pop(p.name, None)
            else:
                self._texts[p.name] = old
            raise
        self.params[p.name].set(text)  # text parameters have no listeners: the refresh told the host

    def _swap_source(self, p: BlockParameter, text: str) -> bool:
        """Hand the engine ``text`` as new code when ``text_source`` allows it and the kernel keeps
        its descriptor; False leaves the edit to a re-description (new ports, errors)."""
        found = self.text_source(p.name, text)
        if found is None:
            return False
        kernel, source = found
        try:
            same = source.describe() == self.description.kernels[kernel].descriptor
        except CudapatchError:  # the re-description reports it, with the old kernel still running
            return False
        if not same:
            return False
        assert self._host is not None
        self._host.on_code_changed(self, kernel, source)
        self._texts[p.name] = text
        p.set(text)
        return True

    def replace_kernel_source(self, kernel: int, source: KernelSource) -> bool:
        """Put ``source`` in place of kernel ``kernel``'s code, keeping every port: its parameters
        must have the same types, pointer kinds and directions. Tells no host: the host calls this
        from ``on_code_changed``.

        Returns:
            Whether the kernel's descriptor is unchanged, so the running graph can take the new code
            in place (Code tier); False (another entry-point name, say) needs a rebuild.

        Raises:
            CudapatchError: unknown kernel, a captured call, or the new source's signature differs
                (re-describe the block instead).
            KernelLoadError: the new source cannot be read.
        """
        kernels = self.description.kernels
        if not 0 <= kernel < len(kernels):
            raise CudapatchError(f"block has {len(kernels)} kernels; there is no kernel {kernel}", block=self.name)
        spec = kernels[kernel]
        if not isinstance(spec, KernelSpec):
            raise CudapatchError(f"'{spec.name}' is a captured library call: it has no kernel source", block=self.name)
        desc = source.describe()
        if desc.layout() != spec.descriptor.layout() or [
            (p.dtype, p.is_pointer, p.direction) for p in desc.parameters
        ] != [(p.dtype, p.is_pointer, p.direction) for p in spec.descriptor.parameters]:
            raise CudapatchError(
                f"the new kernel '{desc.entry_point}' has another signature than '{spec.descriptor.entry_point}'; "
                "re-describe the block to change its ports",
                block=self.name,
                kernel=desc.entry_point,
            )
        new_spec = replace(spec, source=source, descriptor=desc)
        self.description = replace(self.description, kernels=kernels[:kernel] + (new_spec,) + kernels[kernel + 1 :])
        return desc == spec.descriptor

    def get(self, name: str) -> Any:
        """Current value of parameter ``name``.

        Raises:
            ParameterError: unknown parameter.
        """
        p = self.params.get(name)
        if p is None:
            raise ParameterError("unknown parameter", block=self.name, param=name)
        return p.value

    # -- structure ----------------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[PortSpec, ...]:
        return self.description.inputs

    @property
    def outputs(self) -> tuple[PortSpec, ...]:
        return self.description.outputs

    @property
    def enabled(self) -> bool:
        """Whether the block runs. ``False`` bypasses it without a rebuild: its kernels are turned off
        in the running graph, and blocks reading an output of it read its input of the same type
        and size instead, else the output's last values. Visible from the next update."""
        return self._enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        on = bool(on)
        if on == self._enabled:
            return
        self._enabled = on
        if self._host is not None:
            self._host.on_enabled_changed(self)

    @property
    def context(self) -> BlockHost | None:
        """The engine context this block is registered with, if any."""
        return self._host

    def attach(self, host: BlockHost) -> None:
        """Called by ``host`` when it registers this block (users call ``Engine.add``): from now on
        the block reports its edits to ``host``, scalar sets through ``host.param_listener(self)``.
        Attaching to the same host again does nothing.

        Raises:
            CudapatchError: the block is attached to another host (``close()`` it there first).
        """
        if self._host is host:
            return
        if self._host is not None:
            raise CudapatchError("block is registered with another engine; close() it there first", block=self.name)
        listener = host.param_listener(self)
        for p in self.params.values():
            if p.spec.kind == "scalar":
                p.subscribe(listener)
        self._host, self._listener = host, listener

    def detach(self, host: BlockHost) -> None:
        """Called by ``host`` when it removes this block: stop reporting to it, and forget the state
        it compiled. Detaching from a host the block is not attached to does nothing."""
        if self._host is not host:
            return
        listener = self._listener
        if listener is not None:
            for p in self.params.values():
                p.unsubscribe(listener)
        self._host = self._listener = None
        # Keep the sizes, shapes and fused group shown as the block's own: reading on from the host's
        # view would keep a closed engine's last plan alive for as long as the block lives.
        self.debug.detach()
        self.debug.state = BlockState.NOT_COMPILED
        self.debug.message = ""

    def refresh(self) -> bool:
        """Re-run ``describe``; if the description changed structurally, the engine rebuilds.

        Returns:
            Whether the structure changed.

        Raises:
            KernelLoadError: the new description cannot be loaded (the old one stays).
        """
        new = self._describe()
        if new == self.description:
            return False
        old, old_params = self.description, self.params
        self.description = new
        self._make_params(old_params)
        if self._host is not None:
            self._host.on_description_changed(self, old)
        return True

    def close(self) -> None:
        """Unregister from the engine (if registered); idempotent."""
        if self._host is not None:
            self._host.unregister_block(self)

    # -- display ------------------------------------------------------------------------------
    def tooltip(self) -> str:
        """The tooltip text (DESIGN.md §6): ``Name: OK``, with GPU time and append fill when known."""
        d = self.debug
        head = f"{self.name}: {d.state.value}" + ("" if self._enabled else " (bypassed)")
        if d.message:
            head += f": {d.message}"
        if d.gpu_ms is not None:
            head += f", {d.gpu_ms:.2f}ms"
        lines = [head] + [f"  {port}: {count}/{cap}" for port, (count, cap) in d.append_fill.items()]
        if d.runs is not None and d.gpu_ms is not None:  # inside a region's body: the time of one iteration
            n, lo, hi = d.runs
            each = (
                f"{d.gpu_ms * 1e3 / n:.1f}µs x {n} (min {lo * 1e3:.1f}µs, max {hi * 1e3:.1f}µs)" if n else "did not run"
            )
            lines.append(f"  Per iteration: {each}")
        if d.fused:
            lines.append(f"  fused: {d.fused}")
        return "\n".join(lines)

    def port(self, name: str) -> PortHandle:
        """A handle on port ``name`` whose ``str()`` is its tooltip (``Particles: 45231/100000``).

        Raises:
            CudapatchError: no such port.
        """
        d = self.description
        spec = d.input(name) or d.output(name)
        if spec is None:
            raise CudapatchError("no such port", block=self.name, port=name)
        return PortHandle(self, spec.name)

    def __str__(self) -> str:
        return self.tooltip()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} '{self.name}' id={self.id} state={self.debug.state.value}>"


@dataclass(frozen=True)
class PortHandle:
    """A port of a block, for tooltips: ``str()`` reads only the block's debug cache."""

    block: Block
    name: str

    def __str__(self) -> str:
        d = self.block.debug
        if self.name in d.append_fill:
            count, cap = d.append_fill[self.name]
            return f"{self.name}: {count}/{cap}"
        spec = self.block.description.input(self.name) or self.block.description.output(self.name)
        assert spec is not None
        n = d.sizes.get(self.name)
        if n is None:
            return f"{self.name}: {spec.dtype.c_name}[?]"
        shape = d.shapes.get(self.name)
        dims = f"[{n}]" if shape is None else f" {shape}"
        return f"{self.name}: {spec.dtype.c_name}{dims}, {n * spec.dtype.itemsize:,} bytes"


def check_block(obj: object) -> Block:
    """Raise a clear error if ``obj`` is not a Block."""
    if not isinstance(obj, Block):
        raise CudapatchError(f"expected a Block, got {type(obj).__name__}")
    return obj
