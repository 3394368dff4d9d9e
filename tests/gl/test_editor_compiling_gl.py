"""A node whose kernel compiles is drawn in the Compiling colour (EGL: Mesa in CI, the NVIDIA driver on the
GPU machine), and in the OK colour once its compile has landed."""

from __future__ import annotations

import numpy as np
import pytest

from ..unit.test_editor_actions import FX, _CompilingEngine, _stats
from ..unit.test_editor_model import _open
from .test_editor_gl import _draw

pytestmark = pytest.mark.gl


def _pixels(img, at, color, width=16, tolerance=20):
    """Pixels of ``color`` in the title starting at ``at`` (tight: Compiling and Warning are both yellows)."""
    x, y = at
    line = img[int(y) : int(y) + 14, int(x) : int(x) + width].reshape(-1, 3)
    return int((np.abs(line - np.array(color[:3]) * 255).max(axis=1) < tolerance).sum())


def test_a_compiling_node_is_drawn_in_the_compiling_colour_until_its_kernel_lands(tmp_path):
    from cudapatch.interop.editor import STATE_COLORS

    engine = _CompilingEngine()
    _, adapter, _, model = _open(tmp_path, FX, engine=engine)
    engine.update()  # first compiles in flight
    model.refresh(_stats(adapter, "NotCompiled"))  # the panel's own refreshes (no rows) keep these states
    img, panel = _draw(model)
    at = panel.layout.titles["fx"]
    assert _pixels(img, at, STATE_COLORS["Compiling"]) > 3
    assert not _pixels(img, at, STATE_COLORS["OK"])
    engine.builder.land()
    model.refresh(_stats(adapter, "OK"))
    img, panel = _draw(model)
    at = panel.layout.titles["fx"]
    assert _pixels(img, at, STATE_COLORS["OK"]) > 3
    assert not _pixels(img, at, STATE_COLORS["Compiling"])
