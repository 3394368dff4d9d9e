"""The node editor's block browser as data: every registered block type (the plugins' too) with its
category and the first line of its docstring, filtered by what the user typed. The panel
(``interop/editor_menus.py``) draws what ``browse`` returns, grouped by category, and creates the chosen
type with ``EditorModel.create`` (one ``HostAdapter`` call, written to the file, undone like any edit).

A type's category is the one its class declares (a ``category`` class attribute, ``category =
"Filters"``), else its package prefix (``core`` of ``core.Scale``, ``thirdparty`` of a plugin's
``thirdparty.Doubler``): the registry itself keeps no category.

Pure: no imgui, no GPU; tested in ``tests/unit/test_editor_actions.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["BrowserEntry", "browse", "category_of"]


@dataclass(frozen=True)
class BrowserEntry:
    """One block type as the browser lists it.

    Attributes:
        name: Qualified name (``core.Scale``): what ``EditorModel.create`` takes.
        label: The name without its package (``Scale``), as listed under its category.
        category: The declared category, else the package prefix.
        summary: The docstring's first line (shown beside or under the label).
        doc: The docstring's first paragraph (the tooltip).
        origin: The plugin that registered the type.
    """

    name: str
    label: str
    category: str
    summary: str
    doc: str
    origin: str


def category_of(block_type: Any) -> str:
    """The category ``block_type`` (a ``BlockType``) is listed under: its class's declared ``category``
    (a non-empty text), else its package prefix."""
    declared = getattr(block_type.cls, "category", None)
    if isinstance(declared, str) and declared.strip():
        return declared.strip()
    return block_type.name.split(".", 1)[0]


def _entry(block_type: Any) -> BrowserEntry:
    doc = block_type.doc or ""
    summary = next((line.strip() for line in doc.splitlines() if line.strip()), "")
    return BrowserEntry(
        name=block_type.name,
        label=block_type.name.split(".", 1)[1],
        category=category_of(block_type),
        summary=summary,
        doc=doc,
        origin=block_type.origin,
    )


def browse(types: Iterable[Any], query: str = "") -> list[BrowserEntry]:
    """The block types matching ``query``, ordered for the browser.

    Every word of ``query`` (case-insensitive, any order) must appear in the type's name, its category
    or its docstring. Types whose name or category holds every word come first (typing ``scale`` lists
    ``core.Scale`` before the types that only mention scaling), then by category and label. An empty
    query lists every type by category and label.

    Args:
        types: The registered block types (a ``BlockTypeRegistry``).
        query: What the user typed in the browser's search field.
    """
    words = query.lower().split()
    ranked: list[tuple[int, str, str, BrowserEntry]] = []
    for block_type in types:
        entry = _entry(block_type)
        rank = 0
        if words:
            named = f"{entry.name} {entry.category}".lower()
            text = f"{named} {entry.doc.lower()}"
            if not all(w in text for w in words):
                continue
            rank = 0 if all(w in named for w in words) else 1
        ranked.append((rank, entry.category.lower(), entry.label.lower(), entry))
    ranked.sort(key=lambda r: r[:3])
    return [r[3] for r in ranked]
