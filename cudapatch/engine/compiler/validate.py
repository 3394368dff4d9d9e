"""The validate phase: which links of the snapshot make sense.

A snapshot can hold what ``Context`` refuses at the edit: a block of another engine, a port a
block's new description no longer has, element types that stopped matching after a re-description,
a second link into one input (a hand-edited patch). Each becomes an error diagnostic naming the
blocks and ports; the links that pass become the patch's edges for the phases after this one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...blocks.regions import accepts_condition
from ..connections import Link
from ..diagnostics import DiagnosticCode
from .draft import PlanDraft

__all__ = ["validate", "relinked", "relinked_since"]


def validate(
    draft: PlanDraft,
    known: tuple[Mapping[int, Any], Mapping[tuple[int, str], Link], tuple[Link, ...], bool] | None = None,
) -> None:
    """Check blocks and links; fill ``draft.links`` and ``draft.incoming``, record errors.

    Args:
        draft: The plan under construction.
        known: The blocks, valid links into each input and links of the last plan, which had no errors
            (incremental planning, ``resume.py``), and whether every block it had is here with the same
            description: a link it held (the same object) between the same block snapshots is valid
            again, and so are all its links at the start of this patch's when every block is.
    """
    snap, blocks, err = draft.snap, draft.blocks, draft.error
    for b in snap.blocks:
        if b.context_id != snap.context_id:
            err(b.id, DiagnosticCode.CROSS_ENGINE, f"block '{b.name}' belongs to another engine")
    incoming, links = draft.incoming, draft.links
    old_blocks, old_incoming, old_links, unchanged = known if known is not None else ({}, {}, (), False)
    start = 0
    touched: list[tuple[int, str]] | None = None  # the only keys whose link may differ from the last plan's
    if old_links and unchanged:
        # No block the last plan had was removed or re-described: the links it had at the start of
        # this patch's, in the same order, are valid again (it had no errors, so all were).
        start = _common_prefix(snap.links, old_links)
        if start:
            # (a copy: ``update`` into the new, empty dict was one C call of 1.0 ms at 10,000 links on
            # the H100 host, holding the interpreter from the frames; a copy takes about a third)
            draft.incoming = incoming = old_incoming.copy()
            touched = [(lk.dst, lk.dst_port) for lk in old_links[start:]]
            for key in touched:  # the last plan's links after them are checked below, if still here
                del incoming[key]
            touched += [(lk.dst, lk.dst_port) for lk in snap.links[start:]]
            links.extend(old_links[:start])
    for lk in snap.links[start:] if start else snap.links:
        src, dst = blocks.get(lk.src), blocks.get(lk.dst)
        key = (lk.dst, lk.dst_port)
        if (
            src is not None
            and dst is not None
            and old_incoming.get(key) is lk
            and old_blocks.get(lk.src) is src
            and old_blocks.get(lk.dst) is dst
            and key not in incoming
        ):
            incoming[key] = lk
            links.append(lk)
            continue
        if src is None or dst is None:
            present = dst or src
            err(
                present.id if present else None,
                DiagnosticCode.CROSS_ENGINE,
                f"link {lk.src_port} -> {lk.dst_port} of '{present.name if present else '?'}' reaches a block that is "
                "not part of this engine",
            )
            continue
        out = src.description.output(lk.src_port)
        inp = dst.description.input(lk.dst_port)
        if out is None:
            err(src.id, DiagnosticCode.UNKNOWN_PORT, f"block '{src.name}' has no output port '{lk.src_port}'")
            continue
        if inp is None:
            err(dst.id, DiagnosticCode.UNKNOWN_PORT, f"block '{dst.name}' has no input port '{lk.dst_port}'")
            continue
        if out.dtype != inp.dtype and not accepts_condition(dst.description, lk.dst_port, out.dtype):
            err(
                dst.id,
                DiagnosticCode.TYPE_MISMATCH,
                f"link {src.name}.{lk.src_port} ({out.dtype.c_name}) -> {dst.name}.{lk.dst_port} ({inp.dtype.c_name}): "
                "element types differ",
            )
            continue
        key = (lk.dst, lk.dst_port)
        if key in incoming:
            err(dst.id, DiagnosticCode.DUPLICATE_LINK, f"input '{dst.name}.{lk.dst_port}' has more than one link")
            continue
        incoming[key] = lk
        links.append(lk)
    if touched is not None:  # (else worked out where asked for: ``relinked_since``)
        draft.relinked, draft.relinked_from = relinked(incoming, old_incoming, touched), old_incoming


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The length of the longest common prefix of two sequences of mostly identical objects (slices
    compared at C speed, halving the length)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


_MISSING = object()

#: The one link into each linked input: ``(block id, input port)`` -> link.
Incoming = Mapping[tuple[int, str], Link]
#: Links added or removed, as ``(key, link)`` pairs of an ``Incoming``.
Relinked = list[tuple[tuple[int, str], Link]]


def relinked(new: Incoming, old: Incoming, keys: Sequence[tuple[int, str]] | None = None) -> Relinked:
    """The links added or removed from ``old`` to ``new`` (``(key, link)`` pairs): the items of
    ``new.items() ^ old.items()``, looked for among ``keys`` only where given (the keys an incremental
    ``validate`` touched), else over both dicts in Python loops. As one set operation over 10,000
    links it was a C call of 2.4-2.6 ms (CPU machine) that held the interpreter from the frames."""
    out: Relinked = []
    if keys is not None:
        for key in dict.fromkeys(keys):
            lk, was = new.get(key, _MISSING), old.get(key, _MISSING)
            if lk is was or (lk is not _MISSING and was is not _MISSING and lk == was):
                continue
            if was is not _MISSING:
                out.append((key, was))  # type: ignore[arg-type]
            if lk is not _MISSING:
                out.append((key, lk))  # type: ignore[arg-type]
        return out
    for key, lk in new.items():
        was = old.get(key, _MISSING)
        if was is not lk and (was is _MISSING or was != lk):
            out.append((key, lk))
    for key, was in old.items():
        lk = new.get(key, _MISSING)
        if lk is not was and (lk is _MISSING or lk != was):
            out.append((key, was))
    return out


def relinked_since(draft: PlanDraft, old_incoming: Incoming) -> Relinked:
    """The links added or removed since the plan whose links were ``old_incoming``: what ``validate``
    found among the keys it touched, else worked out at the first asking, over all links, and kept
    on the draft (a plan that asks for none, a region's, never pays for the loops)."""
    if draft.relinked is None or draft.relinked_from is not old_incoming:
        draft.relinked, draft.relinked_from = relinked(draft.incoming, old_incoming), old_incoming
    return draft.relinked
