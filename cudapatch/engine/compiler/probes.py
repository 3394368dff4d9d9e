"""Probe nodes (see ``engine/probes.py``), placed by the nodes phase right after the block that makes the
probed value, so the edges phase orders them like any reader of that buffer.

A probe whose value the graph does not make (a ``through`` port carrying an external binding) or whose
element type the probe kernel cannot read gets a warning on its block and no node.

**Images.** A probed value is an image when the probe was given a ``(height, width)``, when the sizes
phase planned it 2-D (its shape), or when the block making it or a block reading it has integer
``Width`` and ``Height`` parameters whose product divides the value's scalars into 1 to 4 channels (a
``GlSurfaceWriter`` reading it, an image block of a flat output): ``image_shape`` decides.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..diagnostics import Diagnostic, DiagnosticCode
from ..plan import ProbeNodePlan
from ..probes import PROBE_KINDS, THUMB, probe_grid, record_words
from .draft import BlockSizes, NodeDraft, PlanDraft

__all__ = ["add_probes", "image_shape", "probe_requests"]

_new = tuple.__new__  # skips NamedTuple.__new__ (see plan.py)
Shape = tuple[int, int] | None


def probe_requests(draft: PlanDraft) -> dict[int, list[tuple[str, Shape]]]:
    """Probed outputs by block id (empty when nothing is probed: the nodes phase then does nothing more)."""
    out: dict[int, list[tuple[str, Shape]]] = {}
    for (bid, port), shape in draft.snap.probes:
        out.setdefault(bid, []).append((port, shape))
    return out


def image_shape(values: int, given: Shape, params: list[Mapping[str, object]]) -> tuple[int, int, int] | None:
    """``(height, width, channels)`` of a value of ``values`` scalars, or None when it is not known to be
    an image: from the ``(height, width)`` the probe was given, else from the first of ``params`` (the
    parameter values of the block making it, then of the blocks reading it) with integer ``Width`` and
    ``Height`` that split it into 1 to 4 channels."""
    candidates = [given] if given is not None else []
    for p in params:
        w, h = p.get("Width"), p.get("Height")
        if isinstance(w, int) and isinstance(h, int) and not isinstance(w, bool):
            candidates.append((h, w))
    for shape in candidates:
        if shape is None:
            continue
        h, w = shape
        if h > 0 and w > 0 and values % (h * w) == 0 and 1 <= values // (h * w) <= 4:
            return h, w, values // (h * w)
    return None


def add_probes(draft: PlanDraft, sized: BlockSizes, ports: list[tuple[str, Shape]]) -> None:
    """Append a probe node for each of ``ports`` (outputs of ``sized.block``) to ``draft.drafts``."""
    b = sized.block
    drafts = draft.drafts
    for port, given in ports:
        src = sized.outputs.get(port)
        if src is None or src.kind != "value":
            why = "it is not an output of the block" if src is None else "it carries memory bound from outside"
            draft.warnings.append(
                Diagnostic("warning", b.id, DiagnosticCode.PROBE, f"'{b.name}.{port}' is not probed: {why}")
            )
            continue
        bi = draft.value_buffer[src.ref]  # type: ignore[index]
        buf = draft.buffers[bi]
        kind = PROBE_KINDS.get(buf.dtype.base.name)
        if kind is None:
            what = f"probes cannot read {buf.dtype.c_name} values"
            draft.warnings.append(
                Diagnostic("warning", b.id, DiagnosticCode.PROBE, f"'{b.name}.{port}' is not probed: {what}")
            )
            continue
        values = buf.count * buf.dtype.lanes
        readers = [draft.blocks[lk.dst].values for lk in draft.links if lk.src == b.id and lk.src_port == port]
        dims = src.shape.dims  # a 2-D output is an image by its shape, unless the probe was given one
        planned = (dims[0], dims[1]) if len(dims) == 2 else None
        image = image_shape(values, given if given is not None else planned, [b.values, *readers])
        h, w, c = image if image is not None else (0, 0, 0)
        tw, th = min(w, THUMB), min(h, THUMB)
        grid = probe_grid(values, beside=bool(readers))  # readers run beside it: it leaves them SMs
        head = (len(drafts), len(draft.probe_keys), bi, values, kind, grid, draft.probe_words)
        drafts.append(_new(NodeDraft, (ProbeNodePlan, head, (w, h, c, tw, th), [bi], [])))
        draft.probe_keys.append((b.id, port))
        draft.probe_words += record_words(tw, th)
