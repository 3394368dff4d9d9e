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
from collections.abc import Callable
from typing import Any

from ..kernels.pacing import checkpoint
from .slices import list_of

__all__ = ["PIECE", "drop_each", "drop_gradually"]

#: References dropped between two checkpoints (each frees its own small objects: tens of microseconds).
PIECE = 256

_CONTAINERS = (tuple, list, set, frozenset)

#: Type -> whether its objects are containers taken apart (a subclass of ``_CONTAINERS`` or ``dict``):
#: asked once for each item looked at (tens of thousands a 1,000-block build), where ``isinstance``
#: of a tuple of types, made anew each time, cost six times as much (CPU machine). Learnt per type;
#: it holds the types it learnt (parameter layouts' structs are classes made at run time), 1,024 at
#: most before it forgets them all. An object whose ``__class__`` is not its type (a proxy) is judged
#: by its type: not taken apart, dropped as one object.
_SPLIT: dict[type, bool] = {}


def _learn(t: type) -> bool:
    if len(_SPLIT) > 1024:  # (classes made at run time come and go)
        _SPLIT.clear()
    split = _SPLIT[t] = issubclass(t, (*_CONTAINERS, dict))
    return split


#: Levels of objects taken apart (a retired graph, the plan it holds) and of big containers (a plan's
#: nodes, what a big dict maps to) below ``drop_gradually``'s objects.
_OBJECT_LEVELS = 2
_CONTAINER_LEVELS = 2


def _parts(obj: Any) -> list[Any] | None:
    """The fields of ``obj`` (its ``__dict__``, which holds a dataclass's fields and cached properties
    too; a slotted dataclass's fields), or None: it has none."""
    if isinstance(obj, type):
        return None
    attrs = getattr(obj, "__dict__", None)
    if attrs:
        return list(attrs.values())
    if dataclasses.is_dataclass(obj):
        return [getattr(obj, f.name, None) for f in dataclasses.fields(obj)] or None
    return None


def drop_gradually(objects: list[Any], stop: Callable[[], bool] | None = None) -> Callable[[], Any] | None:
    """Drop the references in ``objects`` (emptied here), taking big objects apart first so that no
    single release frees more than about ``PIECE`` of their parts; ``checkpoint()`` between pieces.

    ``stop``: asked between pieces; when it says True (a build waits for the thread), the rest is
    returned as a callable that goes on where this stopped (and may stop again), else None: done.

    Objects are taken apart two levels down (a replaced graph: its fields; the plan it holds: the
    plan's fields), big containers two levels down too (a plan's 10,000 nodes, and what a big dict
    maps to); the items of a big container are not looked into as objects (looking into each would
    cost more than freeing it). A few things dropped together (a tuple of ``objects``) count as
    ``objects`` themselves."""
    # (items, object levels left, container levels left)
    work: list[tuple[list[Any], int, int]] = [(objects[:], _OBJECT_LEVELS, _CONTAINER_LEVELS)]
    objects.clear()
    return _drop(work, stop)


def drop_each(objects: list[Any]) -> None:
    """Drop the references in ``objects`` (emptied here) one at a time, last first: each one's
    cascade of deallocations is a hold of its own, not one with all the others (a build's drafts,
    state and plan at fused 10,000 blocks were 6.7 ms in one ``list.clear`` on the CPU machine). For
    what is freed right after a frame, where ``drop_gradually``'s CPU is not worth it."""
    while objects:
        objects.pop()


def _drop(work: list[tuple[list[Any], int, int]], stop: Callable[[], bool] | None) -> Callable[[], Any] | None:
    while work:
        if stop is not None and stop():
            return lambda: _drop(work, stop)
        items, objs, conts = work[-1]
        if not items:
            work.pop()
            continue
        batch = items[-PIECE:]
        del items[-PIECE:]
        if objs or conts:
            for i, obj in enumerate(batch):
                split = _SPLIT.get(type(obj))
                if split is None:
                    split = _learn(type(obj))
                if split:
                    if len(obj) > PIECE:
                        if conts:
                            work.append((_items(obj), 0, conts - 1))  # held here: dropping ``obj`` frees only itself
                            # ... and on its own, before them: a batch of several 10,000-item containers
                            # (a plan's dicts) was 2-3 ms of reference counts in one release.
                            work.append(([obj], 0, 0))
                            batch[i] = None
                    elif objs == _OBJECT_LEVELS:
                        work.append((_items(obj), objs, conts))  # a few things dropped together
                    continue
                parts = _parts(obj) if objs else None
                if parts:
                    work.append((parts, objs - 1, conts))  # its fields, held here
            obj = parts = None  # (the loop's last one too)
        batch = None
        checkpoint()
    return None


def _items(obj: Any) -> list[Any]:
    # (in slices: a big dict's keys and values listed in one C call held the GIL for up to 1.4 ms,
    # fused 10,000-block plans on the CPU machine)
    return list_of(obj.keys(), obj.values()) if isinstance(obj, dict) else list_of(obj)
