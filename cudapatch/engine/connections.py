"""ConnectionGraph: links between block ports, by block id and port name."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from .chunked import Chunked, ChunkedOrder

__all__ = ["Link", "ConnectionGraph", "find_path"]

_Node = TypeVar("_Node", bound=Hashable)


def find_path(start: _Node, target: _Node, successors: Callable[[_Node], Iterable[_Node]]) -> list[_Node] | None:
    """A shortest path ``[start, ..., target]`` following ``successors`` (breadth first), or None when
    ``target`` is not downstream of ``start``. For naming the blocks of a loop in an error: it keeps
    a parent per block seen, which ``reaches`` (the check on every link) does not pay for."""
    parent: dict[_Node, _Node | None] = {start: None}
    queue = [start]
    for node in queue:  # (the list grows while it is read: a queue without pops)
        if node == target:
            path = [node]
            while (up := parent[path[-1]]) is not None:
                path.append(up)
            return path[::-1]
        for nxt in successors(node):
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    return None


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
        self._order = ChunkedOrder()  # the inputs in ``_by_input``'s order: what ``links()`` copies
        # Block id -> the inputs of the links from or to it: removing a block looks at its own links
        # only (a scan of every link was 0.5 ms of the frame thread at 10,000 blocks).
        self._keys_of: dict[int, set[tuple[int, str]]] = {}

    def add(self, link: Link) -> Link | None:
        """Add ``link``; returns the link it replaced on the same input, if any."""
        key = (link.dst, link.dst_port)
        old = self._by_input.get(key)
        self._by_input[key] = link
        if old is not None:
            self._forget(old, key)
        self._order.append(key)  # (a replaced link keeps its place, as in the dict)
        self._keys_of.setdefault(link.src, set()).add(key)
        self._keys_of.setdefault(link.dst, set()).add(key)
        return old

    def _forget(self, link: Link, key: tuple[int, str]) -> None:
        for b in (link.src, link.dst):
            keys = self._keys_of.get(b)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._keys_of[b]

    def remove(self, link: Link) -> bool:
        """Remove ``link``; returns whether it existed."""
        key = (link.dst, link.dst_port)
        if self._by_input.get(key) == link:
            del self._by_input[key]
            self._order.discard(key)
            self._forget(link, key)
            return True
        return False

    def links_of(self, block_id: int) -> list[Link]:
        """The links from or to ``block_id`` (in no particular order): its own, not a scan of every link."""
        return list(map(self._by_input.__getitem__, self._keys_of.get(block_id, ())))

    def remove_block(self, block_id: int) -> list[Link]:
        """Remove every link from or to ``block_id``; returns them (in no particular order)."""
        gone = self.links_of(block_id)
        for lk in gone:
            self.remove(lk)
        return gone

    def link_into(self, block_id: int, port: str) -> Link | None:
        return self._by_input.get((block_id, port))

    def links_from(self, block_id: int) -> list[Link]:
        """The links out of ``block_id`` (in no particular order)."""
        return [lk for lk in self.links_of(block_id) if lk.src == block_id]

    def reaches(self, start: int, target: int, *, follow: Callable[[Link], bool] | None = None) -> bool:
        """True if ``target`` is downstream of (or equal to) ``start``, following only the links
        ``follow`` accepts (None: every link; ``SameFrameOrder`` follows the same-frame ones)."""
        seen, stack = set(), [start]
        while stack:
            b = stack.pop()
            if b == target:
                return True
            if b in seen:
                continue
            seen.add(b)
            stack.extend(lk.dst for lk in self.links_of(b) if lk.src == b and (follow is None or follow(lk)))
        return False

    def path(self, start: int, target: int, *, follow: Callable[[Link], bool] | None = None) -> list[int] | None:
        """The blocks of a shortest path from ``start`` to ``target`` (both included), following only the
        links ``follow`` accepts; None when ``reaches`` would say False."""

        def successors(b: int) -> list[int]:
            return [lk.dst for lk in self.links_of(b) if lk.src == b and (follow is None or follow(lk))]

        return find_path(start, target, successors)

    def links(self) -> Chunked:
        """Every link, in the order they were made, frozen (a snapshot's: copies only the chunks of
        links changed since the last call, ``chunked.py``)."""
        return self._order.freeze(self._by_input.__getitem__)

    def __iter__(self) -> Iterator[Link]:
        return iter(list(self._by_input.values()))

    def __len__(self) -> int:
        return len(self._by_input)
