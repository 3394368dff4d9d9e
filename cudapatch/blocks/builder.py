"""BlockBuilder: the DSL a block uses to describe its GPU work.

Example (the built-in vector add)::

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(bundled_kernel("vector_add"))
        b.input("A", k.in_(0))
        b.input("B", k.in_(1))
        b.output("Sum", k.out(2), size=like("A"))
        k.auto_grid(like("A"), count_param=3)

``commit()`` checks that every kernel parameter is bound exactly once and returns the
``BlockDescription``. Mistakes raise ``CudapatchError`` naming the block, kernel and parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import CudapatchError
from ..kernels.source import KernelSource, PtxFileSource
from ..kernels.types import DType
from .captured import CallDescriptor, CallFunction, CapturedSpec, PrepareFunction, ValidateFunction
from .description import (
    BlockDescription,
    InternalLink,
    KernelSpec,
    ParamSpec,
    PinRef,
    PortSpec,
    SizeRule,
    fixed,
)

__all__ = ["BlockBuilder", "CapturedHandle", "KernelHandle", "KernelPin"]

_INTS = (DType.UINT32, DType.INT32, DType.UINT64, DType.INT64)
_SHAPE_AXES = ("width", "height", "depth", "channels")
_AUTO_AXES = ("width", "height", "depth")  # parameter names commit fills from the grid's shape
_LAUNCH = "launch"  # input(needs=...) default: cover the launches of the kernels the input feeds


@dataclass(frozen=True)
class KernelPin:
    """A parameter of a kernel handle, as an input (``in_``) or output (``out``) pin."""

    handle: KernelHandle
    index: int
    direction: str

    @property
    def ref(self) -> PinRef:
        return PinRef(self.handle.index, self.index)

    @property
    def param(self) -> Any:
        return self.handle.descriptor.parameters[self.index]


class KernelHandle:
    """A kernel added to a builder. Its pins bind ports, scalars and internal links to parameters."""

    def __init__(self, builder: BlockBuilder, index: int, source: KernelSource | None, descriptor: Any = None) -> None:
        self._builder = builder
        self.index = index
        self.source = source
        # No compilation here: the engine compiles in the background.
        self.descriptor = descriptor if descriptor is not None else source.describe()  # type: ignore[union-attr]
        self._grid: SizeRule | None = None
        self._dims = 1
        self._counts: list[tuple[int, SizeRule]] = []
        self._expression: str | None = None

    @property
    def entry_point(self) -> str:
        return self.descriptor.entry_point

    def _pin(self, i: int | str, direction: str) -> KernelPin:
        params = self.descriptor.parameters
        if isinstance(i, str):
            try:
                i = self.descriptor.param_index(i)
            except KeyError:
                raise self._builder.error(
                    f"'{self.entry_point}' has no parameter '{i}' (it has {', '.join(p.name for p in params)})"
                ) from None
        if not 0 <= i < len(params):
            raise self._builder.error(
                f"kernel '{self.entry_point}' has {len(params)} parameters; there is no parameter {i}"
            )
        p = params[i]
        if direction == "out" and (not p.is_pointer or p.direction == "in"):
            raise self._builder.error(
                f"parameter {i} ('{p.name}') of kernel '{self.entry_point}' is an input "
                f"({p.type_name}, {p.direction}); use in_()"
            )
        if direction == "in" and p.is_pointer and p.direction == "out":
            raise self._builder.error(
                f"parameter {i} ('{p.name}') of kernel '{self.entry_point}' is an output; use out()"
            )
        return KernelPin(self, i, direction)

    def in_(self, i: int | str) -> KernelPin:
        """Input pin for parameter ``i`` (index or name; a read pointer or a by-value scalar)."""
        return self._pin(i, "in")

    def out(self, i: int | str) -> KernelPin:
        """Output pin for parameter ``i`` (index or name; a written pointer)."""
        return self._pin(i, "out")

    def auto_grid(
        self, elements: SizeRule | int, *, count_param: int | str | None = None, dims: int | None = None
    ) -> KernelHandle:
        """Launch one thread per element: grid = ceil(count / blockSize of the sidecar); with
        ``dims`` 2 or 3, one thread per position of the rule's 2-D or 3-D shape, grid and block per
        axis (x along the last axis; 16x16 and 8x8x8 threads unless the kernel gives ``blockSize`` per
        axis).

        Unbound integer parameters named ``width``, ``height`` and ``depth`` receive those axes of
        the shape (``commit`` binds them).

        Args:
            elements: The element count (or shape) rule.
            count_param: Index or name of a ``uint``/``int`` parameter that receives the count.
            dims: Launch axes: 1, 2 or 3 (default: as many as the kernel's per-axis ``blockSize``
                has, else 1).
        """
        rule = fixed(elements) if isinstance(elements, int) else elements
        axes = len(self.descriptor.block_dims)
        if dims is None:
            dims = max(1, axes)
        if dims not in (1, 2, 3):
            raise self._builder.error(f"auto_grid of '{self.entry_point}': dims must be 1, 2 or 3, got {dims!r}")
        if axes > 1 and axes != dims:
            raise self._builder.error(
                f"auto_grid of '{self.entry_point}': a {dims}-D launch, but the kernel's blockSize has {axes} axes "
                f"{list(self.descriptor.block_dims)}"
            )
        self._grid = rule
        self._dims = dims
        if count_param is not None:
            self.set_count(count_param, rule)
        return self

    def set_count(self, param: int | str, rule: SizeRule | int) -> KernelHandle:
        """Fill integer parameter ``param`` with a resolved element count (a size, a capacity)."""
        pin = self.in_(param)
        if pin.param.is_pointer or pin.param.dtype not in _INTS:
            raise self._builder.error(
                f"parameter {param} ('{pin.param.name}') of kernel '{self.entry_point}' "
                "must be an integer to hold a count"
            )
        self._builder._bind(pin, "count")
        self._counts.append((pin.index, fixed(rule) if isinstance(rule, int) else rule))
        return self

    def set_shape_params(self, rule: SizeRule | None = None, **params: int | str) -> KernelHandle:
        """Fill integer parameters with axes of ``rule``'s shape (default: the grid's), e.g.
        ``k.set_shape_params(width="w", height="h")``; keys are ``width``, ``height``, ``depth``,
        ``channels``, ``count``."""
        base = rule if rule is not None else self._grid
        if base is None:
            raise self._builder.error(f"set_shape_params of '{self.entry_point}': call auto_grid first or give a rule")
        for axis, param in params.items():
            if axis == "count":
                self.set_count(param, base)
                continue
            if axis not in _SHAPE_AXES:
                raise self._builder.error(
                    f"set_shape_params of '{self.entry_point}': unknown axis '{axis}' "
                    f"(use {', '.join(_SHAPE_AXES)}, count)"
                )
            self.set_count(param, base.at(axis))
        return self

    def _bind_shape_names(self) -> None:
        """Bind unbound integer parameters named width/height/depth to the grid's axes (at commit)."""
        if self._grid is None:
            return
        bound = self._builder._bound
        for i, p in enumerate(self.descriptor.parameters):
            axis = p.name.lower()
            if axis in _AUTO_AXES and PinRef(self.index, i) not in bound and not p.is_pointer and p.dtype in _INTS:
                self.set_count(i, self._grid.at(axis))

    def elementwise(self, expression: str) -> KernelHandle:
        """Declare what this kernel computes per element, as an expression over the block's input
        ports and scalar parameters (``"fma(In, Factor, Offset)"``), so the graph compiler may fuse
        the block with elementwise neighbours into one generated kernel. The block must have one
        kernel, one float output as long as its launch, and float inputs and scalars; the fused
        result equals this kernel's only if the expression does exactly what the kernel does (the
        same operations in the same order: see docs/expressions.md)."""
        self._expression = expression
        return self

    def spec(self) -> KernelSpec | CapturedSpec:
        return KernelSpec(
            source=self.source,
            descriptor=self.descriptor,
            grid=self._grid,
            counts=tuple(self._counts),
            expression=self._expression,
            dims=self._dims,
        )


class CapturedHandle(KernelHandle):
    """A captured library call added to a builder (``BlockBuilder.add_captured``). Pins, by index or
    by parameter name, bind ports, scalars and counts as for kernels; there is no grid."""

    def __init__(
        self,
        builder: BlockBuilder,
        index: int,
        call: CallFunction,
        descriptor: CallDescriptor,
        prepare: PrepareFunction | None,
        validate: ValidateFunction | None,
    ) -> None:
        super().__init__(builder, index, None, descriptor)
        self.call = call
        self.prepare = prepare
        self.validate = validate

    def auto_grid(
        self, elements: SizeRule | int, *, count_param: int | str | None = None, dims: int | None = None
    ) -> KernelHandle:
        raise self._builder.error(f"'{self.entry_point}' is a captured library call: it has no grid")

    def spec(self) -> CapturedSpec:
        return CapturedSpec(self.call, self.descriptor, tuple(self._counts), self.prepare, self.validate)


class BlockBuilder:
    """Collects a block's kernels, ports, scalars and internal links; ``commit()`` makes the description.

    Args:
        type_name: The block type (for the description and messages).
        block_name: The block instance name (for messages).
        base_dir: Directory relative kernel paths are resolved against.
    """

    def __init__(
        self, type_name: str, block_name: str, *, base_dir: Path | None = None, texts: dict[str, str] | None = None
    ) -> None:
        self.type_name = type_name
        self.block_name = block_name
        self.base_dir = base_dir
        self._texts = texts or {}
        self._kernels: list[KernelHandle] = []
        self._inputs: list[PortSpec] = []
        self._outputs: list[PortSpec] = []
        self._params: list[ParamSpec] = []
        self._links: list[InternalLink] = []
        self._bound: dict[PinRef, str] = {}
        self._shape_params: set[str] = set()  # parameters a captured call's validate reads
        self._needs: dict[str, tuple[SizeRule, ...]] = {}  # inputs with needs= given
        self._committed: BlockDescription | None = None

    def error(self, message: str) -> CudapatchError:
        """An error naming this block, for ``describe`` to raise when a parameter's value cannot
        describe the block (``raise b.error("Kind must be C2C, R2C or C2R")``)."""
        return CudapatchError(message, block=self.block_name)

    def _bind(self, pin: KernelPin, what: str) -> None:
        if pin.handle._builder is not self:
            raise self.error("pin belongs to a kernel of another builder")
        ref = pin.ref
        if ref in self._bound:
            raise self.error(
                f"parameter {pin.index} ('{pin.param.name}') of kernel '{pin.handle.entry_point}' is already bound "
                f"to {self._bound[ref]}"
            )
        self._bound[ref] = what

    def _check_name(self, name: str, *, through: bool = False) -> None:
        if not name or not isinstance(name, str):
            raise self.error("port and parameter names must be non-empty strings")
        ports = self._outputs if through else self._inputs + self._outputs
        taken = {p.name for p in ports} | {p.name for p in self._params}
        if name in taken:
            raise self.error(f"the name '{name}' is used twice in this block")

    def add_kernel(self, source: KernelSource | str | Path) -> KernelHandle:
        """Add a kernel; a path means a PTX file with its JSON sidecar beside it.

        Raises:
            KernelLoadError: the kernel cannot be read (missing file, bad sidecar, signature mismatch).
        """
        if not isinstance(source, KernelSource):
            path = Path(source)
            if not path.is_absolute() and self.base_dir is not None:
                path = self.base_dir / path
            source = PtxFileSource(path)
        try:
            handle = KernelHandle(self, len(self._kernels), source)
        except CudapatchError as exc:
            if exc.block is None:
                exc.block = self.block_name
            raise
        self._kernels.append(handle)
        return handle

    def add_captured(
        self,
        fn: CallFunction,
        descriptor: CallDescriptor,
        *,
        prepare: PrepareFunction | None = None,
        validate: ValidateFunction | None = None,
        shape_params: tuple[str, ...] = (),
    ) -> CapturedHandle:
        """Add a library call, captured into the graph as a child-graph node.

        ``fn(stream, pointers, scalars, libs)`` issues the calls (several calls in one function are
        captured as one node: a chain). ``prepare`` runs outside capture before each capture;
        ``validate(counts, values)`` checks input shapes when the graph is planned; the block's
        parameters named in ``shape_params`` (the sizes ``validate`` reads) become structural, so a
        change is checked again before it reaches the library. Kernels and
        captured calls of a block run in the order they were added where they share buffers.
        See ``cudapatch.blocks.captured``.
        """
        if not isinstance(descriptor, CallDescriptor):
            raise self.error("add_captured needs a CallDescriptor (CallDescriptor.of(name, *params))")
        if not callable(fn):
            raise self.error(f"add_captured('{descriptor.entry_point}'): the call must be a function")
        handle = CapturedHandle(self, len(self._kernels), fn, descriptor, prepare, validate)
        self._kernels.append(handle)
        self._shape_params.update(shape_params)
        return handle

    def input(
        self,
        name: str,
        *pins: KernelPin,
        required: bool = True,
        description: str = "",
        needs: SizeRule | int | str | None = _LAUNCH,
        keep: bool = False,
    ) -> str:
        """A buffer input port feeding one or more kernel pointer parameters (same element type).

        ``needs`` is what its data must cover before the block may launch (checked when the graph is
        planned; a shorter or other-shaped input is an error on the block, which then never
        launches): by default, for read-only (``const``) inputs, the launches of the kernels it feeds
        (at least the grid's element
        count; its axes, for 2-D/3-D inputs and grids), a size rule, or None for no check (a lookup
        table the kernel indexes by its own bounds).

        ``keep=True``: the value linked in keeps a buffer of its own (never reused by other values,
        so it still holds this frame's data when the next frame starts).
        """
        self._check_name(name)
        if not pins:
            raise self.error(f"input '{name}' needs at least one kernel pin")
        dtype = self._pins_dtype(name, pins, pointer=True)
        for pin in pins:
            self._bind(pin, f"input '{name}'")
        self._inputs.append(
            PortSpec(
                name,
                "in",
                "buffer",
                dtype,
                tuple(p.ref for p in pins),
                required=required,
                description=description,
                keep=keep,
            )
        )
        if isinstance(needs, str) and needs != _LAUNCH:
            raise self.error(f"input '{name}': needs= takes a size rule, a count or None, not {needs!r}")
        if needs != _LAUNCH:
            self._needs[name] = () if needs is None else (fixed(needs) if isinstance(needs, int) else needs,)  # type: ignore[assignment]
        return name

    def output(
        self,
        name: str,
        pin: KernelPin,
        *more: KernelPin,
        size: SizeRule | int,
        description: str = "",
        keep: bool = False,
    ) -> str:
        """A buffer output port written by ``pin`` (an ``out()`` pin); ``size`` is its element count.

        ``more`` pins (of this or other kernels of the block) get the same buffer: kernels that
        build one output in steps run in the order they were added.

        ``keep=True`` pins the output to a buffer of its own: the engine never lets another value
        reuse it, so it keeps its data after the frame and across frames (state such as a frame
        delay's, or a kernel that reads what it wrote last frame). Outputs nothing in the graph
        reads, append outputs and ``inout`` pins are kept anyway."""
        self._check_name(name)
        pins = (pin, *more)
        if any(p.direction != "out" for p in pins):
            raise self.error(f"output '{name}' must be bound to out() pins")
        dtype = self._pins_dtype(name, pins, pointer=True)
        for p in pins:
            self._bind(p, f"output '{name}'")
        rule = fixed(size) if isinstance(size, int) else size
        self._outputs.append(
            PortSpec(
                name, "out", "buffer", dtype, tuple(p.ref for p in pins), size=rule, description=description, keep=keep
            )
        )
        return name

    def through(self, name: str, *, description: str = "") -> str:
        """Pass input ``name`` on as an output of the same name: the block modifies the buffer in
        place (its pins are ``inout``), and blocks linked to this output run after it.

        Example (a particle force)::

            k = b.add_kernel(forces_source)      # void forces(/*inout*/ float4* particles, ...)
            b.input("Particles", k.in_(0))
            b.through("Particles")
        """
        self._check_name(name, through=True)
        inp = next((p for p in self._inputs if p.name == name), None)
        if inp is None:
            raise self.error(f"through('{name}') needs an input called '{name}' declared first")
        kernels = {k.index: k for k in self._kernels}
        if not any(kernels[ref.kernel].descriptor.parameters[ref.param].direction != "in" for ref in inp.pins):
            raise self.error(f"through('{name}'): no kernel writes input '{name}'; declare one pin inout")
        self._outputs.append(
            PortSpec(name, "out", "through", inp.dtype, (), description=description or inp.description)
        )
        return name

    def append_output(
        self,
        name: str,
        data: KernelPin,
        counter: KernelPin,
        *,
        capacity: SizeRule | int,
        description: str = "",
    ) -> str:
        """An append buffer output: ``data`` gets the storage, ``counter`` the ``uint*`` counter.

        The engine zeroes the counter with a memset node at the start of every launch.
        """
        self._check_name(name)
        if data.direction != "out":
            raise self.error(f"append output '{name}': data must be an out() pin")
        dtype = self._pins_dtype(name, (data,), pointer=True)
        cp = counter.param
        if not cp.is_pointer or cp.dtype != DType.UINT32 or cp.direction != "inout":
            raise self.error(
                f"append output '{name}': the counter must be a 'uint*' parameter with direction inout, "
                f"got '{cp.name}' ({cp.type_name}, {cp.direction})"
            )
        self._bind(data, f"append output '{name}'")
        self._bind(counter, f"counter of append output '{name}'")
        rule = fixed(capacity) if isinstance(capacity, int) else capacity
        self._outputs.append(
            PortSpec(
                name, "out", "append", dtype, (data.ref,), counter=(counter.ref,), size=rule, description=description
            )
        )
        return name

    def scalar(
        self,
        name: str,
        *pins: KernelPin,
        default: Any = 0,
        range: tuple[float | None, float | None] | None = None,  # noqa: A002 - the DSL word users expect
        dtype: DType | None = None,
        description: str = "",
        choices: tuple[int, ...] = (),
    ) -> str:
        """A scalar parameter; its value goes into every pin (by-value kernel parameters of one type).

        With no pins it is a block-level value used only in size rules (e.g. a capacity).
        ``choices`` (integer parameters): the only values it takes, shown as a menu by hosts.
        """
        self._check_name(name)
        if pins:
            dt = self._pins_dtype(name, pins, pointer=False)
            if dtype is not None and dtype != dt:
                raise self.error(f"scalar '{name}' declared {dtype.c_name} but its pins are {dt.c_name}")
        elif dtype is None:
            raise self.error(f"scalar '{name}' without pins needs dtype=")
        else:
            dt = dtype
        for pin in pins:
            self._bind(pin, f"scalar '{name}'")
        lo, hi = range if range is not None else (None, None)
        spec = ParamSpec(
            name, dt, default, lo, hi, tuple(p.ref for p in pins), description=description, choices=tuple(choices)
        )
        from .parameter import BlockParameter  # validates the default (and choices) now, with the block named

        BlockParameter(spec, self.block_name)
        self._params.append(spec)
        return name

    def text(self, name: str, *, default: str = "", description: str = "", choices: tuple[str, ...] = ()) -> str:
        """A text parameter (kernel source, an expression ...). Returns its current value, so
        ``describe`` can build from it; setting it re-describes the block (Code tier when only
        kernel code changed).

        ``choices``: the only values it takes (``("float", "double")``), shown as a menu by hosts; the
        value returned is then always one of them, spelled as declared (``"Double "`` gives
        ``"double"``).

        Raises:
            ParameterError: the current value is not one of ``choices`` (naming the choices), or the
                choices or the default are not valid.
        """
        self._check_name(name)
        spec = ParamSpec(name, None, default, kind="text", description=description, choices=tuple(choices))
        value = self._texts.get(name, default)
        if spec.choices:
            from .parameter import BlockParameter

            value = BlockParameter(spec, self.block_name).validate(value)  # type: ignore[assignment]
        self._params.append(spec)
        return value

    def connect(self, src: KernelPin, *dst: KernelPin, size: SizeRule | int) -> None:
        """Link a kernel's output pin to other kernels' input pins inside the block (an internal buffer)."""
        if src.direction != "out" or not dst or any(d.direction != "in" for d in dst):
            raise self.error("connect(src, *dst) needs an out() pin and at least one in_() pin")
        dtype = self._pins_dtype("internal link", (src, *dst), pointer=True)
        self._bind(src, "an internal link")
        for d in dst:
            self._bind(d, "an internal link")
        rule = fixed(size) if isinstance(size, int) else size
        self._links.append(InternalLink(src.ref, tuple(d.ref for d in dst), rule, dtype))

    def _input_needs(self) -> tuple[PortSpec, ...]:
        """The input ports with ``needs`` filled: as given, or the grids of the kernels each feeds."""
        kernels = {k.index: k for k in self._kernels}
        out = []
        for port in self._inputs:
            needs = self._needs.get(port.name)
            if needs is None:
                grids: list[SizeRule] = []
                for ref in port.pins:
                    if kernels[ref.kernel].descriptor.parameters[ref.param].direction != "in":
                        grids = []  # state updated in place (a counter, particles): its own size rules
                        break
                    k = kernels[ref.kernel]
                    grid = k._grid
                    if grid is not None and k._dims == 1 and not grid.flat_only:
                        grid = grid.at("count")  # a 1-D launch reads elements: any axes of that many do
                    if grid is not None and grid not in grids:
                        grids.append(grid)
                needs = tuple(grids)
            out.append(replace(port, needs=needs) if needs else port)
        return tuple(out)

    def _pins_dtype(self, name: str, pins: tuple[KernelPin, ...], *, pointer: bool) -> DType:
        dtypes = set()
        for pin in pins:
            p = pin.param
            if p.is_pointer != pointer:
                kind = "a pointer" if p.is_pointer else "a by-value scalar"
                raise self.error(
                    f"'{name}': parameter {pin.index} ('{p.name}') of kernel '{pin.handle.entry_point}' is {kind}"
                )
            dtypes.add(p.dtype)
        if len(dtypes) != 1:
            raise self.error(f"'{name}': pins disagree on element type ({', '.join(sorted(d.c_name for d in dtypes))})")
        return dtypes.pop()

    def commit(self) -> BlockDescription:
        """Check completeness and return the description.

        Raises:
            CudapatchError: an unbound kernel parameter, a size rule naming an unknown port/parameter.
        """
        if self._committed is not None:
            return self._committed
        for k in self._kernels:
            k._bind_shape_names()
        inputs_with_needs = self._input_needs()
        rules: list[tuple[str, SizeRule]] = []
        for port in self._outputs:
            if port.kind != "through":
                rules.append((f"output '{port.name}'", port.size))  # type: ignore[arg-type]
        for link in self._links:
            rules.append(("internal link", link.size))
        for k in self._kernels:
            if k._grid is not None:
                rules.append((f"grid of '{k.entry_point}'", k._grid))
            rules.extend((f"count of '{k.entry_point}'", r) for _, r in k._counts)
        for port in inputs_with_needs:
            rules.extend((f"needs of input '{port.name}'", r) for r in port.needs)
        inputs = {p.name for p in self._inputs}
        params = {p.name: p for p in self._params}
        structural: set[str] = set()
        for name in sorted(self._shape_params):
            if name not in params:
                raise self.error(f"shape parameter '{name}' of a captured call is not a parameter of the block")
            structural.add(name)
        for what, rule in rules:
            if rule.like is not None and rule.like not in inputs:
                raise self.error(f"{what}: size rule refers to unknown input '{rule.like}'")
            for name in rule.params:
                ps = params.get(name)
                if ps is None:
                    raise self.error(f"{what}: size rule refers to unknown parameter '{name}'")
                if ps.dtype is None or ps.dtype.base.kind not in "iu" or ps.dtype.lanes != 1:
                    raise self.error(f"{what}: size parameter '{name}' must be an integer")
                structural.add(name)
        for k in self._kernels:
            for i, p in enumerate(k.descriptor.parameters):
                if PinRef(k.index, i) not in self._bound:
                    raise self.error(f"parameter {i} ('{p.name}') of kernel '{k.entry_point}' is not bound")
        param_specs = tuple(
            ParamSpec(**{**p.__dict__, "structural": True}) if p.name in structural else p for p in self._params
        )
        self._committed = BlockDescription(
            type_name=self.type_name,
            kernels=tuple(k.spec() for k in self._kernels),
            inputs=inputs_with_needs,
            outputs=tuple(self._outputs),
            params=param_specs,
            internal_links=tuple(self._links),
        )
        return self._committed
