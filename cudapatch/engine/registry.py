"""BlockRegistry: the blocks of one engine, in registration order."""

from __future__ import annotations

from collections.abc import Iterator

from ..blocks.block import Block
from ..errors import CudapatchError

__all__ = ["BlockRegistry"]


class BlockRegistry:
    """Blocks by id, iterated in registration order (which makes compiled plans deterministic)."""

    def __init__(self) -> None:
        self._blocks: dict[int, Block] = {}

    def add(self, block: Block) -> None:
        """Add ``block``.

        Raises:
            CudapatchError: already registered, or another block has the same name.
        """
        if block.id in self._blocks:
            raise CudapatchError("block is already registered", block=block.name)
        if any(b.name == block.name for b in self._blocks.values()):
            raise CudapatchError("another block already has this name", block=block.name)
        self._blocks[block.id] = block

    def remove(self, block: Block) -> bool:
        """Remove ``block``; returns whether it was there."""
        return self._blocks.pop(block.id, None) is not None

    def get(self, block_id: int) -> Block | None:
        return self._blocks.get(block_id)

    def by_name(self, name: str) -> Block | None:
        return next((b for b in self._blocks.values() if b.name == name), None)

    def __contains__(self, block: object) -> bool:
        return isinstance(block, Block) and self._blocks.get(block.id) is block

    def __iter__(self) -> Iterator[Block]:
        return iter(list(self._blocks.values()))

    def __len__(self) -> int:
        return len(self._blocks)
