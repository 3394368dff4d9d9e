"""Where a block's diagnostic comes from in a patch file: ``path:line`` of the operator that made it.

The engine's diagnostics name blocks, never patch files: the engine knows no files (a TouchDesigner
network has none). Errors found when a patch file is loaded already carry the file and line; errors
found when the loaded patch is compiled (a While without ``Max``, a FrameDelay whose ``In`` does not
fit) do not. A host that runs a patch file maps each block back to its operator's line with
``operator_places`` and shows ``located(d, places)`` instead of ``d.message``.

An inner block of a composite points at the composite operator's line; when the composite comes
from a file, the inner operator's own line there follows in parentheses
(``patch.toml:12 (blur.toml:7)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..blocks.composite import Composite

if TYPE_CHECKING:
    from ..engine.diagnostics import Diagnostic
    from .adapter import HostAdapter
    from .patch import Patch

__all__ = ["located", "operator_places"]


def operator_places(adapter: HostAdapter, patch: Patch) -> dict[int, str]:
    """Block id → ``path:line`` of the patch file's operator that made the block, for every operator
    of ``patch`` the adapter runs (inner blocks of composites included). Operators without a known
    line (a patch built in code) are left out. Linear in the number of blocks; block ids change
    when an operator is swapped, so a host computes this when it shows diagnostics."""
    file = str(patch.path) if patch.path is not None else "<patch>"
    ops = adapter.operators()
    places: dict[int, str] = {}
    for name, spec in patch.operators.items():
        if spec.line is None or name not in ops:
            continue
        here = f"{file}:{spec.line}"
        block = adapter.block(name)
        places[block.id] = here
        if isinstance(block, Composite):
            _inner_places(block, here, None, places)
    return places


def _inner_places(composite: Composite, here: str, inner: str | None, places: dict[int, str]) -> None:
    """The places of a composite's inner blocks: ``here``, then the deepest inner line known."""
    layout = composite.layout
    if layout is None:
        return
    for local, block in layout.blocks.items():
        line = layout.lines.get(local)
        deeper = f"{layout.file}:{line}" if layout.file is not None and line is not None else inner
        places[block.id] = f"{here} ({deeper})" if deeper is not None else here
        if isinstance(block, Composite):
            _inner_places(block, here, deeper, places)


def located(d: Diagnostic, places: Mapping[int, str]) -> str:
    """``d``'s message, after the place of its block when one is known (``p.toml:12: While ...``)."""
    place = places.get(d.block_id) if d.block_id is not None else None
    return f"{place}: {d.message}" if place is not None else d.message
