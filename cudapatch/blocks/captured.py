"""Captured library calls: the block-side description of work that reaches the graph by stream capture.

Library kernels (cuBLAS, cuFFT, cuRAND, cuSOLVER, cuSPARSE) cannot be added as kernel nodes: the
engine captures a block's call function on a side stream and inserts the result as a child-graph
node. A block describes such a call like a kernel, through a ``CallDescriptor`` whose parameters
are pins, so ports, scalars and counts bind exactly as they do for kernels::

    GEMM = CallDescriptor.of(
        "gemm",
        buffer_in("A", "float"), buffer_in("B", "float"), buffer_out("C", "float"),
        host_scalar("M", "int"), host_scalar("N", "int"), host_scalar("K", "int"),
        device_scalar("alpha", "float"), device_scalar("beta", "float"),
    )

    def describe(self, b):
        c = b.add_captured(gemm_call, GEMM, validate=check_gemm)
        b.input("A", c.in_("A")) ...

The call function is ``fn(stream, pointers, scalars, libs)``: ``pointers`` maps every pointer
parameter (and every device scalar) to a device address, ``scalars`` every host scalar and count
to its value, ``libs`` is this node's ``LibraryScope`` (``cudapatch.blocks.libraries``: handles,
cached plans, workspaces). It issues library calls on ``stream`` and returns nothing.

Device scalars (cuBLAS ``alpha``/``beta`` in device pointer mode) live in engine-owned device
memory: changing one is a device write, no re-capture. A host scalar or a pointer change
re-captures the call (the Recapture tier).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..kernels.descriptor import KernelDescriptor, KernelParamDescriptor
from ..kernels.types import DType, parse_type_name
from .description import SizeRule
from .libraries import LibraryScope, nvmath_module

__all__ = [
    "CallDescriptor",
    "CallFunction",
    "CapturedSpec",
    "LibraryScope",
    "PrepareFunction",
    "ValidateFunction",
    "buffer_in",
    "buffer_inout",
    "buffer_out",
    "device_scalar",
    "host_scalar",
    "nvmath_module",
]

#: ``fn(stream, pointers, scalars, libs)``: issue the library calls on ``stream`` (capture is active).
CallFunction = Callable[[int, Mapping[str, int], Mapping[str, Any], LibraryScope], None]
#: ``prepare(pointers, scalars, libs)``: runs before every capture, outside it: create plans and
#: generators, size and reserve workspaces (anything that allocates or initialises).
PrepareFunction = Callable[[Mapping[str, int], Mapping[str, Any], LibraryScope], None]
#: ``validate(counts, values)``: element counts of the block's inputs by port name and the block's
#: parameter values; returns a message when the shapes do not fit the operation, else None. Runs
#: when the graph is planned (no GPU), so a bad shape is an error on the block, not a library status.
ValidateFunction = Callable[[Mapping[str, int], Mapping[str, Any]], "str | None"]


def _dtype(t: str | DType) -> DType:
    if isinstance(t, DType):
        return t
    dtype, pointer = parse_type_name(t)
    if pointer:
        raise ValueError(f"give the element type ('{t.rstrip('* ')}'), not a pointer type")
    return dtype


def buffer_in(name: str, dtype: str | DType) -> KernelParamDescriptor:
    """A device pointer the call reads."""
    return KernelParamDescriptor(name, _dtype(dtype), True, "in")


def buffer_out(name: str, dtype: str | DType) -> KernelParamDescriptor:
    """A device pointer the call writes."""
    return KernelParamDescriptor(name, _dtype(dtype), True, "out")


def buffer_inout(name: str, dtype: str | DType) -> KernelParamDescriptor:
    """A device pointer the call reads and writes in place (an LU factorisation's matrix)."""
    return KernelParamDescriptor(name, _dtype(dtype), True, "inout")


def host_scalar(name: str, dtype: str | DType) -> KernelParamDescriptor:
    """A value the call receives on the host: changing it re-captures the call."""
    return KernelParamDescriptor(name, _dtype(dtype), False, "in")


def device_scalar(name: str, dtype: str | DType) -> KernelParamDescriptor:
    """A value kept in device memory, passed to the call as a pointer (``pointers[name]``):
    changing it is a device write, no re-capture. List it in ``CallDescriptor.of`` like the others;
    the descriptor records it in ``device_scalars``."""
    return _DeviceScalar(name, _dtype(dtype), False, "in")


class _DeviceScalar(KernelParamDescriptor):
    """Marks a ``device_scalar`` until ``CallDescriptor.of`` records its name."""


@dataclass(frozen=True)
class CallDescriptor(KernelDescriptor):
    """The parameters of a captured call: pointers, host scalars and device scalars, in order.

    A ``KernelDescriptor`` whose ``entry_point`` is the call's name, so the compiler, tooltips and
    diagnostics treat it like a kernel. Build one with ``CallDescriptor.of``.
    """

    device_scalars: tuple[str, ...] = ()
    constants: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, name: str, *params: KernelParamDescriptor, description: str = "", **constants: Any) -> CallDescriptor:
        """A descriptor named ``name`` with ``params`` (from ``buffer_in``, ``buffer_out``,
        ``buffer_inout``, ``host_scalar``, ``device_scalar``). ``constants`` (hashable values) reach
        the call, ``prepare`` and ``validate`` in ``scalars`` beside the parameters, e.g. the
        precision a block was described with: ``CallDescriptor.of("gemm", ..., double=True)``.

        Raises:
            ValueError: duplicate parameter names.
        """
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise ValueError(f"call '{name}': duplicate parameter names {names}")
        device = tuple(p.name for p in params if isinstance(p, _DeviceScalar))
        plain = tuple(KernelParamDescriptor(p.name, p.dtype, p.is_pointer, p.direction) for p in params)
        return cls(
            name,
            plain,
            block_size=1,
            description=description,
            device_scalars=device,
            constants=tuple(sorted(constants.items())),
        )

    def is_device_scalar(self, index: int) -> bool:
        """Whether parameter ``index`` lives in device memory."""
        return self.parameters[index].name in self.device_scalars


@dataclass(frozen=True)
class CapturedSpec:
    """A captured call of a block: what ``BlockBuilder.add_captured`` records.

    Sits in ``BlockDescription.kernels`` beside ``KernelSpec``s, in the order the block added them,
    so pins (``PinRef(index, param)``), internal links and hazards work the same for both.

    Attributes:
        call: The call function (compares by identity: use a module-level function).
        descriptor: Its parameters.
        counts: ``(param index, rule)``: integer host scalars that receive a resolved element count.
        prepare: Runs outside capture before every capture (plans, generators, workspaces).
        validate: Checks input shapes when the graph is planned.
    """

    call: CallFunction
    descriptor: CallDescriptor
    counts: tuple[tuple[int, SizeRule], ...] = ()
    prepare: PrepareFunction | None = None
    validate: ValidateFunction | None = None
    grid: None = None  # a captured call has no launch grid
    source: None = None  # nor kernel source: nothing to compile

    @property
    def name(self) -> str:
        return self.descriptor.entry_point
