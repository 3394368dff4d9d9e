"""BlockRegistry: the blocks of one engine, in registration order.

A registered composite's inner blocks are not registered themselves, yet the engine meets their ids
(kernels, faults, diagnostics of the flattened patch): ``get`` finds them too, and ``owner`` says
which registered composite shows what happens to them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..blocks.block import Block
from ..blocks.composite import Composite
from ..errors import CudapatchError

__all__ = ["BlockRegistry"]


class BlockRegistry:
    """Blocks by id, iterated in registration order (which makes compiled plans deterministic)."""

    def __init__(self) -> None:
        self._blocks: dict[int, Block] = {}
        #: The registered composites, by id (the Context flattens them when it freezes the patch).
        self.composites: dict[int, Composite] = {}
        self._added: set[int] = set()  # ids added since ``take_added`` (the board's publish)

    def add(self, block: Block) -> None:
        """Add ``block``.

        Raises:
            CudapatchError: already registered, or another block has the same name.
        """
        if block.id in self._blocks:
            raise CudapatchError("block is already registered", block=block.name)
        if any(b.name == block.name for b in self._blocks.values()):
            raise CudapatchError("another block already has this name", block=block.name)
        if self.composites and self.owner(block.id) is not None:
            comp = self.owner(block.id)[0]  # type: ignore[index]
            raise CudapatchError(f"block is inside composite '{comp.name}': it runs as part of it", block=block.name)
        self._blocks[block.id] = block
        self._added.add(block.id)
        if isinstance(block, Composite):
            self.composites[block.id] = block

    def take_added(self) -> set[int]:
        """The ids of the blocks added since the last call (``DiagnosticBoard.publish`` writes the state
        of those, and of the blocks whose diagnostics or running state changed, not of every block)."""
        added, self._added = self._added, set()
        return added

    def remove(self, block: Block) -> bool:
        """Remove ``block``; returns whether it was there."""
        self.composites.pop(block.id, None)
        return self._blocks.pop(block.id, None) is not None

    def ids(self) -> Iterable[int]:
        """The registered blocks' ids, in registration order (a live view: do not change the registry
        while iterating it)."""
        return self._blocks.keys()

    def get(self, block_id: int) -> Block | None:
        """The registered block ``block_id``, or an inner block of a registered composite."""
        b = self._blocks.get(block_id)
        if b is None and self.composites:
            found = self.owner(block_id)
            return found[2] if found is not None else None
        return b

    def owner(self, block_id: int) -> tuple[Composite, str, Block] | None:
        """For an inner block of a registered composite: ``(composite, qualified name, inner block)``,
        else None."""
        for comp in self.composites.values():
            for name, inner in comp.inner_blocks():
                if inner.id == block_id:
                    return comp, f"{comp.name}/{name}", inner
        return None

    def by_name(self, name: str) -> Block | None:
        return next((b for b in self._blocks.values() if b.name == name), None)

    def __contains__(self, block: object) -> bool:
        return isinstance(block, Block) and self._blocks.get(block.id) is block

    def __iter__(self) -> Iterator[Block]:
        return iter(list(self._blocks.values()))

    def __len__(self) -> int:
        return len(self._blocks)
