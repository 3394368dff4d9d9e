"""The composite the unit tests share: two Scales in a chain behind one exposed Gain."""

from __future__ import annotations

from cudapatch import Composite, CompositeBuilder, Scale


class TwoScales(Composite):
    """``Out = (In * Gain) * Gain + 1`` through two inner Scales ``a`` -> ``b``; one exposed Gain sets
    both. ``TwoScales(child_graph=True)`` runs it as a child-graph node."""

    type_name = "TwoScales"

    def compose(self, c: CompositeBuilder) -> None:
        c.add("a", Scale(Factor=2.0))
        c.add("b", Scale(Factor=3.0, Offset=1.0))
        c.link("a.Out", "b.In")
        c.expose("In", "a.In")
        c.expose("Out", "b.Out")
        c.expose("Gain", "a.Factor", "b.Factor")
