"""What a frame says about its regions: the iterations each ``While``/``For`` ran, and a warning for
a ``While`` that ran ``Max`` of them (its condition may still hold: the guard stopped it).

Each loop's iteration counter is one of the graph's append counters (``RegionPlan.counter``), so
it comes back through the readback ring with the frame it belongs to: reading it costs no driver
call and never waits for the GPU.
"""

from __future__ import annotations

from typing import Any

from .diagnostics import Diagnostic, DiagnosticCode
from .registry import BlockRegistry

__all__ = ["region_iterations", "region_warnings", "show_iterations"]


def region_iterations(graph: Any, region_id: int) -> int | None:
    """Iterations region ``region_id`` ran in the newest completed frame of ``graph`` (None: not a
    loop of this graph, or no frame completed yet)."""
    if graph is None or graph.readback is None:
        return None
    rp = graph.plan.regions.get(region_id)
    if rp is None or rp.counter is None:
        return None
    return graph.readback.value(rp.counter)  # type: ignore[no-any-return]


def region_warnings(graph: Any, blocks: BlockRegistry) -> tuple[Diagnostic, ...]:
    """A ``region-max`` warning for each While that ran its ``Max`` iterations in the frame read."""
    if graph is None or graph.readback is None:
        return ()
    out = []
    for rid, rp in graph.plan.regions.items():
        b = blocks.get(rid)
        if b is None or rp.kind != "while":
            continue
        n = graph.readback.value(rp.counter)
        limit = int(b.get("Max"))
        if n is not None and limit and n >= limit:
            out.append(
                Diagnostic(
                    "warning",
                    rid,
                    DiagnosticCode.REGION_MAX,
                    f"While '{b.name}' stopped at Max ({limit} iterations) before its condition turned false",
                )
            )
    return tuple(out)


def show_iterations(graph: Any, blocks: BlockRegistry) -> None:
    """Put each loop's iterations of the frame read into its tooltip, as ``Iterations: n/limit``
    (``Count`` for a For, ``Max`` for a While), at every profiling level."""
    if graph is None or graph.readback is None:
        return
    for rid, rp in graph.plan.regions.items():
        b = blocks.get(rid)
        if b is None or rp.counter is None or rp.limit is None:
            continue
        n = graph.readback.value(rp.counter)
        if n is not None:
            b.debug.append_fill = {**b.debug.append_fill, "Iterations": (n, int(b.get(rp.limit)))}
