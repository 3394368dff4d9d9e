"""The validate phase: which links of the snapshot make sense.

A snapshot can hold what ``Context`` refuses at the edit: a block of another engine, a port a
block's new description no longer has, element types that stopped matching after a re-description,
a second link into one input (a hand-edited patch). Each becomes an error diagnostic naming the
blocks and ports; the links that pass become the patch's edges for the phases after this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...blocks.regions import accepts_condition
from ..connections import Link
from .draft import PlanDraft

__all__ = ["validate"]


def validate(
    draft: PlanDraft,
    known: tuple[Mapping[int, Any], Mapping[tuple[int, str], Link], tuple[Link, ...]] | None = None,
) -> None:
    """Check blocks and links; fill ``draft.links`` and ``draft.incoming``, record errors.

    Args:
        draft: The plan under construction.
        known: The blocks, valid links into each input and links of the last plan, which had no errors
            (incremental planning, ``resume.py``): a link it held (the same object) between the same
            block snapshots is valid again.
    """
    snap, blocks, err = draft.snap, draft.blocks, draft.error
    for b in snap.blocks:
        if b.context_id != snap.context_id:
            err(b.id, "cross-engine", f"block '{b.name}' belongs to another engine")
    incoming, links = draft.incoming, draft.links
    old_blocks, old_incoming, old_links = known if known is not None else ({}, {}, ())
    start = 0
    if old_links and all(old_blocks.get(b.id, b) is b for b in snap.blocks):
        # No block the last plan had was re-described or changed: the links it had, in the same
        # order at the start of this patch's, are valid again (it had no errors, so all were).
        n = len(old_links)
        if snap.links[:n] == old_links:  # identical objects compare at once
            start = n
            incoming.update(old_incoming)
            links.extend(old_links)
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
                "cross-engine",
                f"link {lk.src_port} -> {lk.dst_port} of '{present.name if present else '?'}' reaches a block that is "
                "not part of this engine",
            )
            continue
        out = src.description.output(lk.src_port)
        inp = dst.description.input(lk.dst_port)
        if out is None:
            err(src.id, "unknown-port", f"block '{src.name}' has no output port '{lk.src_port}'")
            continue
        if inp is None:
            err(dst.id, "unknown-port", f"block '{dst.name}' has no input port '{lk.dst_port}'")
            continue
        if out.dtype != inp.dtype and not accepts_condition(dst.description, lk.dst_port, out.dtype):
            err(
                dst.id,
                "type-mismatch",
                f"link {src.name}.{lk.src_port} ({out.dtype.c_name}) -> {dst.name}.{lk.dst_port} ({inp.dtype.c_name}): "
                "element types differ",
            )
            continue
        key = (lk.dst, lk.dst_port)
        if key in incoming:
            err(dst.id, "duplicate-link", f"input '{dst.name}.{lk.dst_port}' has more than one link")
            continue
        incoming[key] = lk
        links.append(lk)
