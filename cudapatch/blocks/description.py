"""BlockDescription: the pure-data result of describing a block.

Everything here is frozen and compares by structure (kernel list, ports, parameters, internal
links), never by object identity, so the engine can tell whether a re-described block changed.
Kernels and pins are referred to by their index in the block, not by handle objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from math import prod
from typing import TYPE_CHECKING, Literal, NamedTuple

from ..kernels.descriptor import KernelDescriptor
from ..kernels.source import KernelSource
from ..kernels.types import DType

if TYPE_CHECKING:
    from .captured import CapturedSpec

__all__ = [
    "PinRef",
    "SizeRule",
    "like",
    "from_param",
    "fixed",
    "computed",
    "shape_of",
    "KernelSpec",
    "PortSpec",
    "ParamSpec",
    "InternalLink",
    "BlockDescription",
    "PortKind",
    "PinType",
    "ScalarValue",
]

PortKind = Literal["buffer", "append", "through"]
ScalarValue = int | float | tuple


class PinRef(NamedTuple):
    """Parameter ``param`` of kernel number ``kernel`` of the block (a tuple: cheap to hash)."""

    kernel: int
    param: int


@dataclass(frozen=True)
class SizeRule:
    """How an element count, and the shape around it, is found: like an input port, from a scalar
    parameter, fixed, computed, or from axes (``shape_of``).

    Exactly one of ``like``, ``param``, ``fixed``, ``dims`` is set, or ``fn`` (with ``like`` optional).
    The count ``n`` becomes ``n // divide * scale + extra``: ``scale`` for several elements per item
    (3 floats per particle), ``extra`` for a header in front, ``divide`` to get items back from a
    buffer that holds several elements per item.

    ``fn`` computes ``n`` from several values: ``fn(count, params)`` with the element count of
    input ``like`` (None without one) and ``{name: int value}`` of the parameters in ``uses``
    (which become structural). It may return a ``Shape`` or a tuple of axes instead of a count.
    Use a module-level function: the rule compares by identity.

    Shapes: ``like`` with no arithmetic keeps the input's shape; ``dims`` (ints or parameter names,
    outermost first) and ``channels`` make one; every other rule gives a flat ``(n,)``. ``axis``
    (``width``, ``height``, ``depth``, ``channels``, ``count``) turns the rule into one number of
    that shape: how kernels get their width and height parameters filled.
    """

    like: str | None = None
    param: str | None = None
    fixed: int | None = None
    scale: int = 1
    extra: int = 0
    divide: int = 1
    fn: Callable[[int | None, Mapping[str, int]], object] | None = None
    uses: tuple[str, ...] = ()
    dims: tuple[int | str, ...] = ()
    channels: int = 1
    axis: str | None = None

    def __post_init__(self) -> None:
        if self.fn is not None:
            if self.param is not None or self.fixed is not None or self.dims:
                raise ValueError("a computed SizeRule takes like= and uses=, not param=, fixed= or dims=")
        elif sum(x is not None for x in (self.like, self.param, self.fixed, self.dims or None)) != 1:
            raise ValueError("a SizeRule needs exactly one of like=, param=, fixed=, dims=")
        if self.divide < 1:
            raise ValueError("a SizeRule's divide must be at least 1")
        if len(self.dims) > 3:
            raise ValueError("a shape has at most 3 axes")
        if self.channels < 1:
            raise ValueError("a shape needs at least 1 channel")
        if self.axis is not None and self.axis not in ("width", "height", "depth", "channels", "count"):
            raise ValueError(f"axis must be width, height, depth, channels or count, got {self.axis!r}")

    @property
    def params(self) -> tuple[str, ...]:
        """The scalar parameters this rule reads (they are structural)."""
        if self.fn is not None:
            return self.uses
        if self.dims:
            return tuple(d for d in self.dims if isinstance(d, str))
        return (self.param,) if self.param is not None else ()

    @cached_property  # read for every rule of every block on each rebuild
    def keeps_shape(self) -> bool:
        """Whether the rule passes its ``like`` input's shape on (no arithmetic on the count)."""
        return self.like is not None and self.fn is None and self.scale == 1 and self.divide == 1 and not self.extra

    @cached_property
    def flat_only(self) -> bool:
        """Whether the rule always gives a 1-D count (the rules that existed before shapes)."""
        return not self.dims and self.fn is None and not self.keeps_shape and self.axis is None

    @cached_property
    def whole(self) -> SizeRule:
        """The rule without its ``axis``: the whole shape an axis rule reads one number of (made once)."""
        return replace(self, axis=None) if self.axis is not None else self

    def at(self, axis: str) -> SizeRule:
        """This rule's shape reduced to one number: an axis (``width``, ``height``, ``depth``,
        ``channels``) or the element ``count``."""
        return replace(self, axis=axis)

    def resolve(self, like_count: int | None, values: Mapping[str, object]) -> int:
        """The element count, given the ``like`` input's count and the block's parameter values."""
        if self.fn is not None:
            got = self.fn(like_count, {p: int(values[p]) for p in self.uses})  # type: ignore[call-overload]
            if isinstance(got, tuple):
                got = prod(got[0]) * got[1] if got and isinstance(got[0], tuple) else prod(got)
            n = int(got)  # type: ignore[call-overload]
        elif self.dims:
            n = prod(int(values[d]) if isinstance(d, str) else d for d in self.dims) * self.channels  # type: ignore
        elif self.like is not None:
            n = int(like_count or 0)
        elif self.param is not None:
            n = int(values[self.param])  # type: ignore[call-overload]
        else:
            n = int(self.fixed)  # type: ignore[arg-type]
        return max(0, n // self.divide * self.scale + self.extra)

    def __str__(self) -> str:
        if self.fn is not None:
            args = ", ".join(([f"like '{self.like}'"] if self.like else []) + [f"'{p}'" for p in self.uses])
            base = f"{getattr(self.fn, '__name__', 'computed')}({args})"
        elif self.dims:
            base = "shape (" + ", ".join(f"'{d}'" if isinstance(d, str) else str(d) for d in self.dims) + ")"
            base = base if self.channels == 1 else f"{base} x{self.channels} channels"
        else:
            param = f"parameter '{self.param}'" if self.param else str(self.fixed)
            base = f"like '{self.like}'" if self.like else param
        base = base if self.divide == 1 else f"{base} / {self.divide}"
        base = base if self.scale == 1 else f"{base} x{self.scale}"
        base = base if not self.extra else f"{base} + {self.extra}"
        return base if self.axis is None else f"{self.axis} of {base}"


def like(port: str, scale: int = 1, *, divide: int = 1, extra: int = 0) -> SizeRule:
    """Element count of input port ``port`` (``// divide * scale + extra``); with no arithmetic the
    input's shape too."""
    return SizeRule(like=port, scale=scale, divide=divide, extra=extra)


def from_param(name: str, scale: int = 1, extra: int = 0) -> SizeRule:
    """Element count taken from scalar parameter ``name`` (which becomes structural), times
    ``scale``, plus ``extra``."""
    return SizeRule(param=name, scale=scale, extra=extra)


def computed(fn: Callable[[int | None, Mapping[str, int]], object], *params: str, like: str | None = None) -> SizeRule:
    """An element count computed by ``fn(count of input like (or None), {param: value})`` from
    several parameters (which become structural), e.g. ``computed(rows_times_cols, "M", "N")``.
    ``fn`` may return a ``Shape`` or a tuple of axes (outermost first) to give a shape."""
    return SizeRule(like=like, fn=fn, uses=tuple(params))


def fixed(count: int) -> SizeRule:
    """A fixed element count."""
    return SizeRule(fixed=int(count))


def shape_of(*dims: int | str, channels: int = 1) -> SizeRule:
    """A shape from axes, outermost first: each an int or the name of an integer parameter (which
    becomes structural), e.g. ``shape_of("Height", "Width")`` or ``shape_of(64, 64, 64)``.

    Raises:
        ValueError: no axis or more than three.
    """
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"shape_of takes 1 to 3 axes, got {len(dims)}")
    return SizeRule(dims=tuple(d if isinstance(d, str) else int(d) for d in dims), channels=int(channels))


@dataclass(frozen=True)
class KernelSpec:
    """A kernel of a block: its source, descriptor, grid rule and auto-filled count parameters.

    Attributes:
        source: Where the kernel comes from.
        descriptor: What ``source.describe()`` returned (parameters, block size).
        grid: One thread per element of this count; ``None`` launches a single block.
        counts: ``(param index, rule)`` pairs: that ``uint`` parameter receives the resolved count.
        dims: Launch axes: 1 (one thread per element of the grid rule's count), 2 or 3 (one thread
            per position of its shape, which must have that many axes).
        expression: What the kernel computes per element, in the expression language, over the
            block's input ports and scalars (``KernelHandle.elementwise``): the compiler may fuse
            it with its neighbours (see ``engine/compiler/fusion.py``). None: never fused.
    """

    source: KernelSource
    descriptor: KernelDescriptor
    grid: SizeRule | None
    counts: tuple[tuple[int, SizeRule], ...]
    dims: int = 1
    expression: str | None = None


class PinType(NamedTuple):
    """What flows through a port: ``kind`` (``buffer`` or ``append``) and element type. Links need
    equal element types; an append output feeds buffer inputs (its data, ``capacity`` elements)."""

    kind: str
    dtype: DType

    def __str__(self) -> str:
        return f"{self.dtype.c_name}[]" if self.kind == "buffer" else f"append {self.dtype.c_name}[]"


@dataclass(frozen=True)
class PortSpec:
    """A buffer port of a block.

    Attributes:
        name: Port name, unique within the block.
        direction: ``in`` or ``out``.
        kind: ``buffer``; for outputs also ``append``, or ``through``: the buffer of the input of the
            same name, which the block modified in place (particle state flowing through a chain).
        dtype: Element type.
        pins: Kernel parameters that receive the buffer pointer.
        counter: For append outputs, the kernel parameters that receive the counter pointer.
        size: For outputs, the element count (capacity for append outputs).
        required: For inputs, whether the block can run without it.
        description: Text for tooltips.
        needs: For inputs, what the data must cover before the block may launch: each rule's count
            (and, for 2-D/3-D rules, its axes). By default the launches of the kernels it feeds.
        keep: Pin the buffer to this port's value: never shared with other values (buffer reuse).
            On an output: its data stays readable after the frame and across frames (a FrameDelay's
            state, a result a host reads). On an input: the value it reads is kept.
    """

    name: str
    direction: Literal["in", "out"]
    kind: PortKind
    dtype: DType
    pins: tuple[PinRef, ...]
    counter: tuple[PinRef, ...] = ()
    size: SizeRule | None = None
    required: bool = True
    description: str = ""
    needs: tuple[SizeRule, ...] = ()
    keep: bool = False

    @property
    def pin_type(self) -> PinType:
        return PinType("buffer" if self.kind == "through" else self.kind, self.dtype)


@dataclass(frozen=True)
class ParamSpec:
    """A scalar parameter of a block.

    Attributes:
        name: Parameter name, unique within the block.
        dtype: Value type.
        default: Initial value.
        minimum / maximum: Inclusive range, if any.
        pins: Kernel parameters that receive the value.
        structural: True when a size or grid depends on it: changing it rebuilds the graph.
        choices: The values it may take (text or integer parameters; empty: any value of its type).
            A choice's name is ``str(choice)``: hosts show the names as a menu, and ``choice`` finds
            the choice a name stands for.
    """

    name: str
    dtype: DType | None
    default: ScalarValue | str
    minimum: float | None = None
    maximum: float | None = None
    pins: tuple[PinRef, ...] = ()
    structural: bool = False
    description: str = ""
    kind: Literal["scalar", "text"] = "scalar"  # text: source code or other strings that re-describe the block
    choices: tuple[int | str, ...] = ()

    def choice(self, value: object) -> int | str | None:
        """The choice ``value`` stands for: a choice itself, or a string naming one with other case or
        spacing (``"Double "`` for ``double``, ``"16"`` for 16); None when it names none."""
        if isinstance(value, bool):  # True == 1, but a toggle is not a menu entry
            return None
        if isinstance(value, str):
            if value in self.choices:
                return value
            key = " ".join(value.split()).casefold()
            found = [c for c in self.choices if " ".join(str(c).split()).casefold() == key]
            return found[0] if len(found) == 1 else None
        return next((c for c in self.choices if not isinstance(c, str) and c == value), None)


@dataclass(frozen=True)
class InternalLink:
    """An output parameter of one kernel feeding input parameters of others, inside the block."""

    src: PinRef
    dst: tuple[PinRef, ...]
    size: SizeRule
    dtype: DType


@dataclass(frozen=True)
class BlockDescription:
    """What a block is, as data: compared structurally to decide whether the graph must be rebuilt."""

    type_name: str
    kernels: tuple[KernelSpec | CapturedSpec, ...]  # in the order the block added them
    inputs: tuple[PortSpec, ...]
    outputs: tuple[PortSpec, ...]
    params: tuple[ParamSpec, ...]
    internal_links: tuple[InternalLink, ...] = ()
    #: ``(input, output)`` pairs: the input's value comes out of the output one frame later (a
    #: ``FrameDelay``). A link into such an input is the one link allowed to close a cycle.
    feedback: tuple[tuple[str, str], ...] = ()

    # Lookups by name; cached_property writes the instance __dict__ directly, so it works on a frozen
    # dataclass and is not part of equality.
    @cached_property
    def _by_name(self) -> tuple[dict[str, PortSpec], dict[str, PortSpec], dict[str, ParamSpec]]:
        return ({p.name: p for p in self.inputs}, {p.name: p for p in self.outputs}, {p.name: p for p in self.params})

    @cached_property
    def kernel_roles(self) -> tuple[tuple[tuple[str, object], ...], ...]:
        """For each kernel, for each parameter: ``(role, ref)`` saying what feeds it.

        Roles: ``input`` (port name), ``output`` / ``append`` / ``counter`` (output port name),
        ``internal`` (internal link index), ``scalar`` (parameter name), ``count`` (a SizeRule).
        Computed once per description, so a Cold rebuild does not redo it for every block.
        """
        roles: dict[PinRef, tuple[str, object]] = {}
        for port in self.inputs:
            for pin in port.pins:
                roles[pin] = ("input", port.name)
        for port in self.outputs:
            for pin in port.pins:
                roles[pin] = ("append" if port.kind == "append" else "output", port.name)
            for pin in port.counter:
                roles[pin] = ("counter", port.name)
        for i, link in enumerate(self.internal_links):
            for pin in (link.src, *link.dst):
                roles[pin] = ("internal", i)
        for ps in self.params:
            for pin in ps.pins:
                roles[pin] = ("scalar", ps.name)
        out = []
        for ki, ks in enumerate(self.kernels):
            for pi, rule in ks.counts:
                roles[PinRef(ki, pi)] = ("count", rule)
            out.append(tuple(roles[PinRef(ki, pi)] for pi in range(len(ks.descriptor.parameters))))
        return tuple(out)

    @cached_property
    def feedback_inputs(self) -> frozenset[str]:
        """The inputs read one frame late (see ``feedback``): links into them do not order blocks."""
        return frozenset(i for i, _ in self.feedback)

    def input(self, name: str) -> PortSpec | None:
        """The input port called ``name``, or None."""
        return self._by_name[0].get(name)

    def output(self, name: str) -> PortSpec | None:
        """The output port called ``name``, or None."""
        return self._by_name[1].get(name)

    def param(self, name: str) -> ParamSpec | None:
        """The parameter called ``name``, or None."""
        return self._by_name[2].get(name)
