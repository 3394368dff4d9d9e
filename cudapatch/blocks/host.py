"""BlockHost: what a block needs from the context it is registered with, as a typed protocol.

Blocks are passive (DESIGN.md §3), yet a registered block must tell its host about edits that
only the block sees: a scalar set (Hot), a bypass (``enabled``), a re-description (Cold, or Code
when only kernel code changed), a text edit that swaps one kernel's code in place (Code), and ``close()``. This
protocol is that whole conversation, seen from the block. The engine's ``Context`` implements it;
the block never imports the engine, so ``blocks`` depends on ``kernels`` only and a test can host
a block with any object that has these methods.

The other direction is just as narrow: a host calls ``Block.attach(host)`` when it registers a
block and ``Block.detach(host)`` when it removes it; the block keeps the host and its parameter
listener itself, so no host writes a block's fields.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..kernels.source import KernelSource
    from .block import Block
    from .description import BlockDescription
    from .parameter import BlockParameter

__all__ = ["BlockHost", "ParamListener"]

#: Called with the parameter after its value changed (``BlockParameter.subscribe``).
ParamListener = Callable[["BlockParameter"], None]


class BlockHost(Protocol):
    """The context a block is registered with (the engine's ``Context``), as the block sees it."""

    def param_listener(self, block: Block) -> ParamListener:
        """The function ``block`` subscribes to each of its scalar parameters, so that a ``set``
        marks the host dirty (Hot, or Cold for a structural parameter). Called once per
        ``attach``; the block re-subscribes the same function after a re-description."""
        ...

    def on_description_changed(self, block: Block, old: BlockDescription) -> None:
        """``block`` re-described itself (``Block.refresh``) and ``old`` is what it was: Code tier
        when only kernel code changed, else drop links that no longer fit and rebuild."""
        ...

    def on_snapshot_stale(self, block: Block) -> None:
        """``block.name`` or ``block.description`` was assigned: what the host froze of the block for
        its last build is stale."""
        ...

    def on_enabled_changed(self, block: Block) -> None:
        """``block.enabled`` changed (a bypass): turn its work off or on without a rebuild."""
        ...

    def on_code_changed(self, block: Block, kernel: int, new_source: KernelSource | None = None) -> None:
        """Kernel ``kernel`` of ``block`` has new code (Code tier). With ``new_source``, the host
        puts that source in place first (``Block.replace_kernel_source``).

        Raises:
            CudapatchError: unknown kernel, or ``new_source`` has another signature.
        """
        ...

    def unregister_block(self, block: Block) -> None:
        """Remove ``block`` from the patch (``Block.close``); the host calls ``block.detach``."""
        ...
