"""Freeing a replaced plan or graph a piece at a time, off the frame thread.

Dropping the last reference to a 10,000-node plan frees it in one go: a cascade of deallocations in C
that holds the GIL throughout (2 ms on the CPU machine, ``benchmarks/bench_swap_cpu.py``), which the
frame thread's next ``update()`` waits for when it starts meanwhile. ``drop_gradually`` takes such
objects apart first (holding what they refer to), then lets go of the parts a piece at a time, with a
``checkpoint()`` between pieces: a frame that starts meanwhile runs first (``pacing.FrameGuard``).
It only reads and drops references: objects someone else still holds are left as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..kernels.pacing import checkpoint

__all__ = ["PIECE", "drop_gradually"]

#: References dropped between two checkpoints (each frees its own small objects: tens of microseconds).
PIECE = 256

_CONTAINERS = (tuple, list, set, frozenset)


def _big(value: Any) -> bool:
    return (isinstance(value, (*_CONTAINERS, dict))) and len(value) > PIECE


def _parts(obj: Any) -> list[Any] | None:
    """What ``obj`` refers to, if dropping it would free many objects at once: the items of a big
    container, or the attributes of an object that holds one. None: ``obj`` is freed as it is."""
    parts = _container_parts(obj)
    if parts is not None or isinstance(obj, (*_CONTAINERS, dict)):
        return parts
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
        extra = getattr(obj, "__dict__", None)  # cached properties beside the fields
        if extra:
            values += list(extra.values())
    else:
        attrs = getattr(obj, "__dict__", None)
        if not attrs:
            return None
        values = list(attrs.values())
    return values if any(_big(v) for v in values) else None


def drop_gradually(objects: list[Any]) -> None:
    """Drop the references in ``objects`` (emptied here), taking big objects apart first so that no
    single release frees more than about ``PIECE`` of their parts; ``checkpoint()`` between pieces.

    Two levels are taken apart: ``objects`` themselves (a plan: its fields), and the big containers
    they hold (a plan's 10,000 nodes); the items of those are dropped a piece at a time as they are
    (looking into each would cost more than freeing it)."""
    work: list[tuple[list[Any], int]] = [(objects[:], 0)]
    objects.clear()
    while work:
        items, depth = work[-1]
        if not items:
            work.pop()
            continue
        batch = items[-PIECE:]
        del items[-PIECE:]
        if depth < 2:
            for obj in batch:
                if depth == 0 and isinstance(obj, (*_CONTAINERS, dict)) and len(obj) <= PIECE:
                    work.append((_items(obj), 0))  # a few things dropped together: each as one of ``objects``
                    continue
                parts = _parts(obj) if depth == 0 else _container_parts(obj)
                if parts:
                    work.append((parts, depth + 1))  # held here: dropping ``obj`` frees only the object itself
            obj = parts = None  # (the loop's last one too)
        batch = None
        checkpoint()


def _items(obj: Any) -> list[Any]:
    return [*obj.keys(), *obj.values()] if isinstance(obj, dict) else list(obj)


def _container_parts(obj: Any) -> list[Any] | None:
    if isinstance(obj, (*_CONTAINERS, dict)) and len(obj) > PIECE:
        return _items(obj)
    return None
