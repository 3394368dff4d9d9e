"""The host adapter's bookkeeping of links and region placements between operators, indexed by
operator: a delete, rename, disconnect or hot swap touches the links and placements of the
operators it edits, not every one of the patch (a scan of a list of every link took 24-50 ms of
such a call at 10,000 operators on the CPU machine: a host's frame or three).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["OperatorLink", "OperatorLinks", "Placements"]


@dataclass(frozen=True)
class OperatorLink:
    """A link between host operators: ``src.src_port -> dst.dst_port``."""

    src: str
    src_port: str
    dst: str
    dst_port: str

    def __str__(self) -> str:
        return f"{self.src}.{self.src_port} -> {self.dst}.{self.dst_port}"


class OperatorLinks:
    """The links between operators, in the order they were made; one per input, as in the engine
    (a link into a linked input replaces the one there)."""

    def __init__(self) -> None:
        self._by_number: dict[int, OperatorLink] = {}  # insertion order: the order made
        self._into: dict[tuple[str, str], int] = {}  # (dst operator, dst port) -> its link's number
        self._ends: dict[str, set[int]] = {}  # operator -> numbers of the links that start or end at it
        self._numbers = itertools.count()

    def __iter__(self) -> Iterator[OperatorLink]:
        return iter(list(self._by_number.values()))

    def __len__(self) -> int:
        return len(self._by_number)

    def __contains__(self, link: object) -> bool:
        if not isinstance(link, OperatorLink):
            return False
        number = self._into.get((link.dst, link.dst_port))
        return number is not None and self._by_number[number] == link

    def add(self, link: OperatorLink) -> None:
        """Record ``link``, replacing the link into the same input, if any."""
        old = self._into.get((link.dst, link.dst_port))
        if old is not None:
            self._drop(old)
        number = next(self._numbers)
        self._by_number[number] = link
        self._into[(link.dst, link.dst_port)] = number
        self._ends.setdefault(link.src, set()).add(number)
        self._ends.setdefault(link.dst, set()).add(number)

    def remove(self, link: OperatorLink) -> bool:
        """Forget ``link``; returns whether it was recorded."""
        if link not in self:
            return False
        self._drop(self._into[(link.dst, link.dst_port)])
        return True

    def of(self, op: str) -> list[OperatorLink]:
        """The links that start or end at operator ``op``, in the order they were made."""
        return [self._by_number[n] for n in sorted(self._ends.get(op, ()))]

    def remove_operator(self, op: str) -> None:
        """Forget every link that starts or ends at ``op``."""
        for number in list(self._ends.get(op, ())):
            self._drop(number)

    def rename(self, op: str, new: str) -> None:
        """Operator ``op`` is called ``new`` now: its links say so, in their places."""
        numbers = self._ends.pop(op, set())
        for number in numbers:
            lk = self._by_number[number]
            self._by_number[number] = OperatorLink(
                new if lk.src == op else lk.src, lk.src_port, new if lk.dst == op else lk.dst, lk.dst_port
            )
            if lk.dst == op:
                del self._into[(op, lk.dst_port)]
                self._into[(new, lk.dst_port)] = number
        if numbers:
            self._ends.setdefault(new, set()).update(numbers)

    def _drop(self, number: int) -> None:
        lk = self._by_number.pop(number)
        del self._into[(lk.dst, lk.dst_port)]
        for op in (lk.src, lk.dst):
            ends = self._ends.get(op)
            if ends is not None:
                ends.discard(number)
                if not ends:
                    del self._ends[op]


class Placements:
    """Which region operator (``If``, ``While``, ``For``) holds which operators, both ways."""

    def __init__(self) -> None:
        self._region: dict[str, str] = {}  # operator -> the region operator holding it
        self._held: dict[str, dict[str, None]] = {}  # region operator -> the operators it holds, in order placed

    def as_dict(self) -> dict[str, str]:
        """Operator -> the region operator holding it (top-level operators are absent)."""
        return dict(self._region)

    def region(self, op: str) -> str | None:
        return self._region.get(op)

    def held(self, region: str) -> list[str]:
        """The operators ``region`` holds, in the order they were placed."""
        return list(self._held.get(region, ()))

    def place(self, op: str, region: str | None) -> None:
        """Put ``op`` in ``region`` (None: at the top level)."""
        old = self._region.pop(op, None)
        if old is not None:
            self._forget(old, op)
        if region is not None:
            self._region[op] = region
            self._held.setdefault(region, {})[op] = None

    def remove_operator(self, op: str) -> None:
        """``op`` is deleted: it leaves its region, and what it held moves to the region around it."""
        outer = self._region.get(op)
        self.place(op, None)
        for child in self.held(op):
            self.place(child, outer)

    def rename(self, op: str, new: str) -> None:
        """Operator ``op`` is called ``new`` now, as a placed operator and as a region."""
        region = self._region.get(op)
        if region is not None:
            self.place(op, None)
            self.place(new, region)
        for child in self.held(op):
            self.place(child, new)

    def _forget(self, region: str, op: str) -> None:
        held = self._held.get(region)
        if held is not None:
            held.pop(op, None)
            if not held:
                del self._held[region]
