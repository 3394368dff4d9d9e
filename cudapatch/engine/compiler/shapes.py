"""Shape propagation: the shape each size rule gives, the launch each kernel gets from its shape, and
the check that every kernel input covers what the launch reads, before anything reaches the GPU.

The sizes phase calls these per block, in topological order, so a rule's ``like`` input already has
its shape. A flat rule (``from_param``, ``fixed``, ``like`` with arithmetic) gives ``(n,)``: every
block written before shapes existed sees exactly the counts it saw before. Only rules that keep or
make shapes (``like("In")``, ``shape_of``, a ``computed`` rule returning axes) and 2-D/3-D launches
look at the axes.

A rule that cannot be resolved (a ``computed`` function raising or returning no count or shape, a
2-D launch over a 1-D shape) raises ``ShapeError``; an input shorter than its kernel's launch, or of
other axes, gives a problem: both become an error on the block, which is left out of the graph (it
never launches), the way a captured call's ``library-shape`` refusal is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...blocks.description import KernelSpec, SizeRule
from ...blocks.shape import Shape
from ..diagnostics import DiagnosticCode
from .draft import resolve_count

if TYPE_CHECKING:
    from ...blocks.description import BlockDescription
    from .draft import Source  # noqa: F401 - annotations only

__all__ = ["ShapeError", "Launch", "check_inputs", "launch_of", "resolve_shape"]

_new = tuple.__new__  # skips NamedTuple.__new__ (see plan.py)

#: A kernel launch: ``((grid x, y, z), (block x, y, z))``.
Launch = tuple[tuple[int, int, int], tuple[int, int, int]]


class ShapeError(Exception):
    """A size rule or launch whose shape cannot be resolved (the message says why)."""


def resolve_shape(rule: SizeRule, inputs: Mapping[str, Source], params: Mapping[str, object]) -> Shape:
    """The shape ``rule`` gives for a block with these input sources and parameter values.

    Raises:
        ShapeError: the rule cannot be resolved.
    """
    if rule.axis is not None:
        whole = resolve_shape(rule.whole, inputs, params)
        return _new(Shape, (((whole.axis(rule.axis)),), 1))
    if rule.fn is not None:
        src = inputs[rule.like] if rule.like is not None else None
        try:
            got = rule.fn(src.count if src is not None else None, {p: int(params[p]) for p in rule.uses})  # type: ignore
        except Exception as exc:  # a user's function: any failure is this rule's error
            raise ShapeError(f"{rule} failed: {type(exc).__name__}: {exc}") from None
        return _shape_result(rule, got)
    if rule.dims:
        dims = []
        for d in rule.dims:
            v = int(params[d]) if isinstance(d, str) else d  # type: ignore[call-overload]
            if v < 0:
                raise ShapeError(f"{rule}: axis {d!r} is {v}, below 0")
            dims.append(v)
        return _new(Shape, (tuple(dims), rule.channels))
    if rule.keeps_shape:
        src = inputs[rule.like]  # type: ignore[index]
        return src.shape
    return _new(Shape, ((resolve_count(rule, inputs, params),), 1))


def _shape_result(rule: SizeRule, got: object) -> Shape:
    """What a ``computed`` rule's function returned, as a shape (after the rule's arithmetic for counts)."""
    if isinstance(got, Shape):
        return got
    if isinstance(got, tuple):
        try:
            return Shape.of(*got)
        except (TypeError, ValueError) as exc:
            raise ShapeError(f"{rule} returned {got!r}, which is no shape: {exc}") from None
    try:
        n = int(got)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        raise ShapeError(f"{rule} returned {got!r}: expected an element count or a tuple of axes") from None
    return _new(Shape, ((max(0, n // rule.divide * rule.scale + rule.extra),), 1))


def launch_of(ks: KernelSpec, shape: Shape | None) -> Launch:
    """Grid and block sizes of kernel ``ks`` over ``shape`` (its grid rule's shape; None: one block).

    A 1-D launch covers the shape's element count; a 2-D or 3-D one its axes, x along the last.

    Raises:
        ShapeError: the shape has fewer axes than the launch.
    """
    desc = ks.descriptor
    dims = ks.dims
    if shape is None:
        return (1, 1, 1), desc.launch_block(dims)
    block = desc.launch_block(dims)
    if dims == 1:
        n = shape.count
        return (max(1, -(-n // block[0])), 1, 1), block
    if shape.ndim != dims:
        raise ShapeError(
            f"'{desc.entry_point}' launches over {dims} axes, but its grid ({ks.grid}) has shape {shape} "
            f"({shape.ndim}-D)"
        )
    w, h, d = shape.width, shape.height, shape.depth
    return (max(1, -(-w // block[0])), max(1, -(-h // block[1])), max(1, -(-d // block[2]))), block


def check_inputs(
    d: BlockDescription,
    inputs: Mapping[str, Source],
    params: Mapping[str, object],
) -> tuple[DiagnosticCode, str] | None:
    """The first input of a block that does not cover what its kernels read, as ``(code, message)``.

    Each input's ``needs`` rules (by default the grids of the kernels it feeds; of a 1-D launch only
    its count) must fit: at least as many elements as the rule's count, and, when both are 2-D or
    3-D, the same axes. Unbound
    optional inputs are not checked (the kernel receives a null pointer and must test it).

    Raises:
        ShapeError: a ``needs`` rule cannot be resolved.
    """
    for port in d.inputs:
        needs = port.needs
        if not needs:
            continue
        src = inputs[port.name]
        if src.kind == "null":
            continue
        have = src.shape
        for rule in needs:
            if rule.like == port.name and rule.keeps_shape:
                continue  # a launch over this very input covers it by construction (``at("count")`` too)
            if rule.axis == "count":  # a 1-D launch's need: elements only, named as its grid rule
                rule = rule.whole
                if src.count >= resolve_count(rule, inputs, params):
                    continue  # the common case, decided on counts alone
            want = resolve_shape(rule, inputs, params)
            if have.count < want.count:
                return DiagnosticCode.INPUT_SHORT, (
                    f"input '{port.name}' holds {have.count} elements{_axes(have)} but needs {want.count}"
                    f"{_axes(want)} ({rule}): the kernel would read past its end"
                )
            if have.ndim >= 2 and want.ndim >= 2 and (have.dims != want.dims or have.channels != want.channels):
                return DiagnosticCode.INPUT_SHAPE, f"input '{port.name}' has shape {have} but needs {want} ({rule})"
    return None


def _axes(shape: Shape) -> str:
    return f" ({shape})" if shape.ndim > 1 or shape.channels > 1 else ""


def flat(count: int) -> Shape:
    """The 1-D shape of ``count`` elements (cheap: the compiler makes one per flat value)."""
    return _new(Shape, ((count,), 1))
