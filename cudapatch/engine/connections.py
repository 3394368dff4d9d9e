"""ConnectionGraph: links between block ports, by block id and port name."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

__all__ = ["Link", "ConnectionGraph"]


@dataclass(frozen=True)
class Link:
    """Output ``src_port`` of block ``src`` feeds input ``dst_port`` of block ``dst``."""

    src: int
    src_port: str
    dst: int
    dst_port: str


class ConnectionGraph:
    """The set of links. An input has at most one link; outputs fan out freely."""

    def __init__(self) -> None:
        self._by_input: dict[tuple[int, str], Link] = {}

    def add(self, link: Link) -> Link | None:
        """Add ``link``; returns the link it replaced on the same input, if any."""
        key = (link.dst, link.dst_port)
        old = self._by_input.get(key)
        self._by_input[key] = link
        return old

    def remove(self, link: Link) -> bool:
        """Remove ``link``; returns whether it existed."""
        key = (link.dst, link.dst_port)
        if self._by_input.get(key) == link:
            del self._by_input[key]
            return True
        return False

    def remove_block(self, block_id: int) -> list[Link]:
        """Remove every link from or to ``block_id``; returns them."""
        gone = [lk for lk in self._by_input.values() if block_id in (lk.src, lk.dst)]
        for lk in gone:
            del self._by_input[(lk.dst, lk.dst_port)]
        return gone

    def link_into(self, block_id: int, port: str) -> Link | None:
        return self._by_input.get((block_id, port))

    def links_from(self, block_id: int) -> list[Link]:
        return [lk for lk in self._by_input.values() if lk.src == block_id]

    def reaches(self, start: int, target: int, *, cut: Collection[tuple[int, str]] = ()) -> bool:
        """True if ``target`` is downstream of (or equal to) ``start`` within one frame: links into
        the inputs in ``cut`` (``(block_id, port)``: feedback inputs, read a frame late) are not followed."""
        seen, stack = set(), [start]
        while stack:
            b = stack.pop()
            if b == target:
                return True
            if b in seen:
                continue
            seen.add(b)
            stack.extend(
                lk.dst
                for lk in self._by_input.values()
                if lk.src == b and (not cut or (lk.dst, lk.dst_port) not in cut)
            )
        return False

    def links(self) -> tuple[Link, ...]:
        """Every link, in the order they were made (a snapshot's: one C-level copy)."""
        return tuple(self._by_input.values())

    def __iter__(self) -> Iterator[Link]:
        return iter(list(self._by_input.values()))

    def __len__(self) -> int:
        return len(self._by_input)
