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
        # Names -> ids of the registered blocks called that (a rename may make two), and each one's
        # name as last seen: ``add`` checks a name in O(1) (a scan of every block took 22 ms of a
        # host's ``add`` call at 10,000 blocks). A rename reaches ``renamed`` through the Context.
        self._named: dict[str, set[int]] = {}
        self._name_of: dict[int, str] = {}

    def add(self, block: Block) -> None:
        """Add ``block``.

        Raises:
            CudapatchError: already registered, or another block has the same name.
        """
        if block.id in self._blocks:
            raise CudapatchError("block is already registered", block=block.name)
        if self._named.get(block.name):
            raise CudapatchError("another block already has this name", block=block.name)
        if self.composites and self.owner(block.id) is not None:
            comp = self.owner(block.id)[0]  # type: ignore[index]
            raise CudapatchError(f"block is inside composite '{comp.name}': it runs as part of it", block=block.name)
        self._blocks[block.id] = block
        self._added.add(block.id)
        self._name_of[block.id] = block.name
        self._named.setdefault(block.name, set()).add(block.id)
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
        if self._blocks.pop(block.id, None) is None:
            return False
        self._forget_name(block.id)
        return True

    def renamed(self, block: Block) -> None:
        """``block`` may have a new name (a rename, or a re-description: the Context cannot tell)."""
        old = self._name_of.get(block.id)
        if old is None or old == block.name or self._blocks.get(block.id) is not block:
            return
        self._forget_name(block.id)
        self._name_of[block.id] = block.name
        self._named.setdefault(block.name, set()).add(block.id)

    def _forget_name(self, block_id: int) -> None:
        name = self._name_of.pop(block_id, None)
        ids = self._named.get(name) if name is not None else None
        if ids is not None:
            ids.discard(block_id)
            if not ids:
                del self._named[name]  # type: ignore[arg-type]

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
        """The registered block called ``name`` (the first registered, where a rename made two), or None."""
        ids = self._named.get(name)
        if not ids:
            return None
        if len(ids) == 1:
            return self._blocks[next(iter(ids))]
        return next(b for b in self._blocks.values() if b.id in ids)

    def __contains__(self, block: object) -> bool:
        return isinstance(block, Block) and self._blocks.get(block.id) is block

    def __iter__(self) -> Iterator[Block]:
        return iter(list(self._blocks.values()))

    def __len__(self) -> int:
        return len(self._blocks)
