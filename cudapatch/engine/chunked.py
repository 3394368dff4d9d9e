"""Snapshots of big ordered collections that cost the frame thread what changed, not their size.

A patch snapshot hands the build thread every block's frozen snapshot and every link. Copying them
into one tuple touches each object (its reference count), and in a 10,000-block patch those are
scattered over the heap: 0.4-0.6 ms per tuple of the frame that starts a build, measured on the CPU
machine (``benchmarks/bench_swap_cpu.py``), where a tight loop over the same copy takes a tenth of
that. ``ChunkedOrder`` keeps the keys in their order in chunks of ``CHUNK`` and each chunk's last
frozen tuple; a snapshot rebuilds only the chunks an edit touched and hands out ``Chunked``, a
sequence over those tuples.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from itertools import chain
from typing import Any, overload

__all__ = ["CHUNK", "Chunked", "ChunkedOrder"]

#: Keys per chunk: a snapshot after one edit copies one chunk and one reference per chunk.
CHUNK = 256


class Chunked(Sequence[Any]):
    """An immutable sequence made of tuples (chunks), equal to any sequence with the same items.

    Iterating is as fast as a tuple's; indexing and slicing make one flat tuple first (once, on the
    thread that asks: the build thread, not the frame thread that made it)."""

    __slots__ = ("_chunks", "_len", "_flat")

    def __init__(self, chunks: tuple[tuple[Any, ...], ...]) -> None:
        self._chunks = chunks
        self._len = sum(map(len, chunks))
        self._flat: tuple[Any, ...] | None = None

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Any]:
        return chain.from_iterable(self._chunks)

    def _tuple(self) -> tuple[Any, ...]:
        flat = self._flat
        if flat is None:
            flat = self._flat = tuple(chain.from_iterable(self._chunks))
        return flat

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Any, ...]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self._tuple()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Chunked):
            if self._chunks == other._chunks:  # (identical chunks compare at C speed, by identity first)
                return True
            return self._len == other._len and self._tuple() == other._tuple()
        if isinstance(other, (tuple, list)):
            return self._len == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __add__(self, other: Sequence[Any]) -> tuple[Any, ...]:
        """A tuple of these items, then ``other``'s (as a tuple's ``+``)."""
        return self._tuple() + tuple(other)

    def __radd__(self, other: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(other) + self._tuple()

    __hash__ = None  # type: ignore[assignment]  # (as a list: a snapshot is compared, never hashed)

    def __reduce__(self) -> tuple[Any, ...]:
        return Chunked, (self._chunks,)

    def __repr__(self) -> str:
        return f"Chunked({list(self)!r})"


class _Chunk:
    __slots__ = ("keys", "view")

    def __init__(self) -> None:
        self.keys: list[Hashable] = []
        self.view: tuple[Any, ...] | None = None  # the values of ``keys`` at the last ``freeze``


class ChunkedOrder:
    """Keys in insertion order, in chunks, with each chunk's last frozen values.

    It follows a dict's order: ``append`` a new key at the end, ``discard`` one (the others keep their
    order), ``touch`` one whose value changed in place. ``freeze(lookup)`` is the values in that order,
    looked up again only in the chunks touched since the last call."""

    __slots__ = ("_chunks", "_at")

    def __init__(self) -> None:
        self._chunks: list[_Chunk] = []
        self._at: dict[Hashable, _Chunk] = {}

    def __len__(self) -> int:
        return len(self._at)

    def append(self, key: Hashable) -> None:
        """Add ``key`` at the end (a key already here is only touched: it keeps its place)."""
        if key in self._at:
            self.touch(key)
            return
        chunks = self._chunks
        if not chunks or len(chunks[-1].keys) >= CHUNK:
            chunks.append(_Chunk())
        last = chunks[-1]
        last.keys.append(key)
        last.view = None
        self._at[key] = last

    def touch(self, key: Hashable) -> None:
        """``key``'s value changed: its chunk is looked up again by the next ``freeze``."""
        c = self._at.get(key)
        if c is not None:
            c.view = None

    def discard(self, key: Hashable) -> None:
        """Remove ``key`` if it is here."""
        c = self._at.pop(key, None)
        if c is None:
            return
        c.keys.remove(key)
        c.view = None
        if not c.keys:
            self._chunks.remove(c)
        if len(self._chunks) > 4 and len(self._chunks) * CHUNK > 4 * len(self._at):
            self._compact()  # mostly empty chunks: a snapshot would copy one reference per key again

    def _compact(self) -> None:
        """Chunk the keys afresh, full (after many removals); every chunk is looked up at the next freeze."""
        keys = [k for c in self._chunks for k in c.keys]
        self._chunks, self._at = [], {}
        for k in keys:
            self.append(k)

    def freeze(self, lookup: Callable[[Any], Any]) -> Chunked:
        """The values of every key in order, ``lookup(key)`` called for the keys of touched chunks only.

        Raises:
            Whatever ``lookup`` raises (a chunk that failed is looked up again next time).
        """
        for c in self._chunks:
            if c.view is None:
                c.view = tuple(map(lookup, c.keys))
        return Chunked(tuple(c.view for c in self._chunks))  # type: ignore[misc]
