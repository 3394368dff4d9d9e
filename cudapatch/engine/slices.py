"""Copies of big dicts and sets made a slice at a time, for the build thread.

Copying a 10,000-entry dict (``dict(d)``, ``dict(islice(d.items(), k))``) or making a set of 10,000
ids is one C call, and a C call holds the GIL throughout: 0.5-1.8 ms each at fused 10,000 blocks on
the CPU machine, and a frame thread that wakes meanwhile starts its frame that much late. Copied
``SLICE`` entries at a time from a Python loop, the interpreter can hand the frame thread the GIL
between two slices (a build thread's switch interval is 0.1 ms: ``build_thread``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from itertools import islice
from typing import Any, TypeVar

__all__ = ["SLICE", "dict_copy", "list_of", "set_of"]

#: Entries per C call: 4096 took up to 1.4 ms per ``update`` on the CPU machine (a growing dict's
#: resizes included), 1024 a quarter of that.
SLICE = 1024

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def dict_copy(d: Mapping[K, V], n: int | None = None) -> dict[K, V]:
    """``dict(d)``, or the first ``n`` items of ``d`` (``dict(islice(d.items(), n))``), in slices."""
    if len(d) <= SLICE:
        return dict(d) if n is None else dict(islice(d.items(), n))
    out: dict[K, V] = {}
    items = iter(d.items()) if n is None else islice(d.items(), n)
    while True:
        before = len(out)
        out.update(islice(items, SLICE))
        if len(out) - before < SLICE:  # (a dict's keys do not repeat: it grew by what was taken)
            return out


def set_of(items: Iterable[Any]) -> set[Any]:
    """``set(items)``, in slices."""
    out: set[Any] = set()
    it = iter(items)
    while True:
        piece = list(islice(it, SLICE))  # (counted by what was taken: the items may repeat)
        out.update(piece)
        if len(piece) < SLICE:
            return out


def list_of(*parts: Iterable[Any]) -> list[Any]:
    """The items of ``parts``, one after another, in a list (``[*a, *b]``), in slices."""
    out: list[Any] = []
    for part in parts:
        it = iter(part)
        while True:
            n = len(out)
            out.extend(islice(it, SLICE))
            if len(out) - n < SLICE:  # (a list grows by what was taken)
                break
    return out
