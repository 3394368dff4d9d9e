"""The delays phase: each running ``FrameDelay`` gets its pair of buffers.

A delay's ``Out`` is a value the delay makes (its start value is written there by its init kernel);
the value linked into its ``In`` is made by the block computing it, later in the frame (the order
phase cut that link). Those two values are the delay's pair: in the plan as compiled (phase 0) the
block computing ``In`` writes the *current* buffer while the readers of ``Out`` read the *previous*
one; the executable graph's second phase swaps the two pointers everywhere, so the roles alternate
every frame with no copy (``engine/phases.py``).

Errors, each on the delay: ``In`` carrying another element count than ``Out`` (Init's count, or
``Count``), ``In`` not computed in the graph (an external buffer passed on in place), ``In`` read
straight from a delay's ``Out`` (its own, or another's: a block must come between), an output
feeding two delays, an append output. A library call touching a pair is an error on its block:
its capture holds the pointers, which the phases cannot swap. Warnings: ``In`` unlinked, or the
block computing it not running: ``Out`` then keeps its start value.
"""

from __future__ import annotations

from ...blocks.captured import CapturedSpec
from ..diagnostics import Diagnostic, DiagnosticCode
from .draft import PlanDraft

__all__ = ["delays"]


def delays(draft: PlanDraft, *, alternating: bool = True) -> None:
    """Fill ``draft.delays`` with ``(block_id, previous value, current value or None)``; record errors.
    ``alternating=False`` (a patch with regions: delays carried by copy nodes, ``region_delays.py``):
    the pointers never swap, so a library call may read or write a pair."""
    sized, incoming, values = draft.sized, draft.incoming, draft.values
    found = [(bid, s) for bid, s in sized.items() if s.block.description.feedback]
    if not found:
        return
    outs = {}  # value index of each delay's Out -> the delay's name
    for _, s in found:
        for _, outp in s.block.description.feedback:
            outs[s.outputs[outp].ref] = s.block.name
    paired: dict[object, str] = {}  # value index of an In -> the delay it feeds
    for bid, s in found:
        name = s.block.name
        for inp, outp in s.block.description.feedback:
            prev = s.outputs[outp]
            lk = incoming.get((bid, inp))
            src_sized = sized.get(lk.src) if lk is not None else None
            if src_sized is None:
                why = (
                    f"'{inp}' is not linked"
                    if lk is None
                    else f"'{draft.blocks[lk.src].name}', which feeds '{inp}', is not running"
                )
                draft.warnings.append(
                    Diagnostic(
                        "warning",
                        bid,
                        DiagnosticCode.DELAY_OPEN,
                        f"FrameDelay '{name}': {why}; '{outp}' keeps its start value",
                    )
                )
                draft.delays.append((bid, prev.ref, None))
                continue
            src = src_sized.outputs[lk.src_port]
            what = f"'{src_sized.block.name}.{lk.src_port}'"
            problem = None
            if src.kind != "value":
                problem = f"{what} passes on an external buffer in place; '{inp}' must be computed in the graph"
            elif src.ref == prev.ref:
                problem = f"'{inp}' reads this delay's own '{outp}' in place; a block must compute a new value"
            elif src.ref in outs:
                problem = f"'{inp}' comes straight from FrameDelay '{outs[src.ref]}'; put a block between the delays"
            elif src.ref in paired:
                problem = f"{what} already feeds FrameDelay '{paired[src.ref]}'; link that delay's '{outp}' instead"
            elif values[src.ref].append:  # type: ignore[index]
                problem = f"{what} is an append output; a delay takes a plain buffer"
            elif src.count != prev.count:
                problem = (
                    f"feedback size mismatch: '{inp}' gets {src.count} elements from {what}, "
                    f"'{outp}' holds {prev.count} (Init's count, or Count)"
                )
            if problem is not None:
                draft.error(bid, DiagnosticCode.DELAY_MISMATCH, f"FrameDelay '{name}': {problem}")
                continue
            paired[src.ref] = name
            draft.delays.append((bid, prev.ref, src.ref))
    if not alternating:
        return
    swapped = {v for _, p, c in draft.delays for v in (p, c) if v is not None}
    for s in sized.values():
        calls = [ks for ks in s.block.description.kernels if isinstance(ks, CapturedSpec)]
        if not calls:
            continue
        touched = [
            src for src in (*s.inputs.values(), *s.outputs.values()) if src.kind == "value" and src.ref in swapped
        ]
        if touched:
            draft.error(
                s.block.id,
                DiagnosticCode.DELAY_CAPTURED,
                f"library call '{calls[0].descriptor.entry_point}' of '{s.block.name}' reads or writes a FrameDelay's "
                "buffers, whose pointers alternate every frame; put a kernel block between",
            )
