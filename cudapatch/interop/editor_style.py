"""The node editor panel's colours and the width of its nodes, shared by its parts (``editor.py`` and
the ``editor_*.py`` modules beside it). The GL tests look for these colours in the rendered frame."""

from __future__ import annotations

__all__ = ["STATE_COLORS", "LINK_COLOR", "PROBE_COLOR", "REFUSED_COLOR", "GROUP_COLORS", "NODE_WIDTH"]

STATE_COLORS = {
    "OK": (0.45, 0.85, 0.45, 1.0),
    "Compiling": (0.9, 0.8, 0.3, 1.0),
    "Warning": (0.95, 0.65, 0.2, 1.0),
    "Error": (0.95, 0.3, 0.3, 1.0),
    "Bypassed": (0.55, 0.55, 0.6, 1.0),
}
LINK_COLOR = (0.3, 0.75, 1.0, 1.0)  # wires (the GL tests look for it)
REFUSED_COLOR = (1.0, 0.25, 0.25, 1.0)  # a refused link, and a probed wire carrying NaN or Inf
PROBE_COLOR = (1.0, 0.6, 0.15, 1.0)  # a probed wire
#: A region's group, by kind: its tint (drawn over the canvas at this alpha) and its border.
GROUP_COLORS = {
    "if": ((0.25, 0.45, 0.95, 0.30), (0.45, 0.6, 1.0, 0.9)),
    "while": ((0.7, 0.3, 0.9, 0.30), (0.8, 0.5, 1.0, 0.9)),
    "for": ((0.15, 0.75, 0.65, 0.30), (0.3, 0.9, 0.8, 0.9)),
    "composite": ((0.75, 0.6, 0.25, 0.22), (0.95, 0.8, 0.4, 0.9)),  # an open composite's inside
}
#: Canvas units: a node's text column (pin labels, parameter widgets) and the Code boxes sized from it.
NODE_WIDTH = 200.0
