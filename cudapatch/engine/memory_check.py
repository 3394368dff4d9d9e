"""The memory check before a build: does the plan's new device memory fit in what the device has free?

A build that realizes a plan allocates every buffer the running graph cannot lend (``realize``
reuses the running graph's allocation of the same block and port when it is large enough). Asking
the driver for more than it has fails half-way through realize, after other allocations were made,
and on some drivers a huge request is slow to refuse. So before anything is allocated, the build
compares what the plan would newly allocate (in pool size classes) with ``cuMemGetInfo``'s free
memory plus the pool's idle blocks (which it gives back when memory is short), keeping
``RESERVE_BYTES`` for the graph itself (instantiation, parameter storage, readback). Too much is an
error on the block with the largest new buffer, naming the largest ones; nothing is allocated and
the running graph keeps running.

``memory_shortfall`` is the pure decision (unit-tested); ``device_free_bytes`` the one driver call;
``realize`` runs both first and raises ``CudaOutOfMemoryError``, which the build turns into an
``out-of-memory`` diagnostic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..kernels._driver import check, driver
from ..kernels.types import DType
from .buffers import size_class
from .plan import BufferPlan, GraphPlan

__all__ = [
    "RESERVE_BYTES",
    "MemoryShortfall",
    "device_free_bytes",
    "lends",
    "memory_shortfall",
    "new_buffers",
]

#: Device memory kept free for the graph beside its buffers (executable graph, parameters, readback).
RESERVE_BYTES = 64 << 20


def lends(b: BufferPlan, dtype: DType, capacity: int) -> bool:
    """Whether a running graph's allocation of ``dtype`` and ``capacity`` bytes, kept under ``b``'s
    block and label, can hold planned buffer ``b`` (the rule ``realize`` lends by)."""
    return dtype is b.dtype and b.count * b.dtype.itemsize <= capacity


def new_buffers(plan: GraphPlan, lent: Mapping[tuple[int, str], tuple[DType, int]]) -> list[tuple[BufferPlan, int]]:
    """The buffers of ``plan`` a build must allocate, with the bytes each takes (its pool size class).

    Args:
        plan: The plan.
        lent: ``(block_id, label)`` -> ``(dtype, capacity)`` of the running graph's allocations.
    """
    out = []
    for b in plan.buffers:
        old = lent.get((b.block_id, b.label))
        if old is None or not lends(b, *old):
            out.append((b, size_class(max(1, b.count * b.dtype.itemsize))))
    return out


@dataclass(frozen=True)
class MemoryShortfall:
    """A plan that does not fit.

    Attributes:
        need_bytes: Bytes the build would allocate (plus ``RESERVE_BYTES``).
        free_bytes: Bytes free on the device, the pool's idle blocks included.
        largest: ``(block_id, what, bytes)`` of the largest new buffers (their own bytes; ``need_bytes``
            counts the pool's size classes), largest first: ``what`` is a
            port (or ``internal<i>``), or for a shared buffer the ``'block.port'`` of the values in it.
    """

    need_bytes: int
    free_bytes: int
    largest: tuple[tuple[int, str, int], ...]

    @property
    def block_id(self) -> int | None:
        """The block the error goes on: the owner of the largest new buffer."""
        return self.largest[0][0] if self.largest else None

    def message(self, names: Mapping[int, str]) -> str:
        """The error text, naming the largest buffers."""
        parts = []
        for bid, what, nbytes in self.largest:
            where = what if "." in what else f"'{names.get(bid, bid)}.{what}'"
            parts.append(f"{where} {_size(nbytes)}")
        return (
            f"the patch needs {_size(self.need_bytes)} of new device memory but only {_size(self.free_bytes)} is "
            f"free; largest buffers: {', '.join(parts)} (nothing was allocated; the running graph keeps running)"
        )


def memory_shortfall(
    plan: GraphPlan,
    *,
    free_bytes: int,
    idle_bytes: int = 0,
    lent: Mapping[tuple[int, str], tuple[DType, int]] | None = None,
    names: Mapping[int, str] | None = None,
    reserve: int = RESERVE_BYTES,
    top: int = 3,
) -> MemoryShortfall | None:
    """Whether building ``plan`` would ask for more device memory than is free.

    Args:
        plan: The plan to build.
        free_bytes: ``cuMemGetInfo``'s free bytes.
        idle_bytes: The pool's idle blocks (freed when an allocation fails, so they count as free).
        lent: The running graph's allocations (see ``new_buffers``).
        names: Block names, for naming the values of shared buffers.
        reserve: Bytes kept free for the graph itself.
        top: How many buffers to name.

    Returns:
        None when it fits, else the shortfall.
    """
    new = new_buffers(plan, lent or {})
    need = sum(n for _, n in new) + reserve
    available = free_bytes + idle_bytes
    if need <= available:
        return None
    new.sort(key=lambda bn: -bn[1])
    largest = tuple(_describe(plan, b, b.count * b.dtype.itemsize, names or {}) for b, _ in new[:top])
    return MemoryShortfall(need, available, largest)


def _describe(plan: GraphPlan, b: BufferPlan, nbytes: int, names: Mapping[int, str]) -> tuple[int, str, int]:
    mem = plan.memory
    if b.block_id >= 0 or mem is None:
        return b.block_id, b.label, nbytes
    values = [mem.values[vi] for vi, bi in enumerate(mem.value_buffer) if bi == b.index]
    who = ", ".join(f"'{names.get(v.block_id, v.block_id)}.{v.label}'" for v in values)
    return values[0].block_id, f"a buffer shared by {who}", nbytes  # a shared buffer holds two values or more


def _size(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def device_free_bytes() -> int:
    """Free device memory of the current context's device (``cuMemGetInfo``).

    Raises:
        CudaError: the call failed.
    """
    free, _total = check(driver().cuMemGetInfo(), "cuMemGetInfo")
    return int(free)
