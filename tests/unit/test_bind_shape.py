"""``engine.bind(..., shape=...)``: a GpuBuffer bound with the shape of what it holds (a GL texture's
height and width, ``GlBridge.bind_texture``) is an image to the blocks that read it."""

from __future__ import annotations

from typing import Any

import pytest

from cudapatch.blocks.library import Blur
from cudapatch.blocks.shape import Shape
from cudapatch.engine.buffers import GpuBuffer
from cudapatch.errors import BindingError
from cudapatch.kernels.types import DType

from .test_live_builds import _landed, engine, realizer  # noqa: F401 (fixtures)


class _Pool:
    """Hands out fake allocations: only the address and size matter to a binding."""

    def __init__(self) -> None:
        self.next = 0x10000

    def acquire(self, nbytes: int) -> Any:
        self.next += 1 << 20
        return type("Alloc", (), {"ptr": self.next, "capacity_bytes": nbytes})()

    def release(self, alloc: Any) -> None:
        pass


def test_a_buffer_bound_with_a_2d_shape_is_an_image_to_an_image_block(engine: Any) -> None:  # noqa: F811
    h, w = 37, 61
    buf = GpuBuffer(_Pool(), DType.UCHAR4, h * w, stream=None)
    blur = engine.add(Blur(name="blur", Format="rgba8"))
    engine.bind(blur, "In", buf, shape=Shape.of(h, w))
    binding = engine.context.snapshot().bindings[(blur.id, "In")]
    assert binding.shape == Shape.of(h, w) and binding.count == h * w
    _landed(engine)
    errors = [d for d in engine.diagnostics() if d.severity == "error"]
    assert not errors, errors  # flat, it was 'shape-unresolved' (a 2-D launch over 1-D)
    assert engine.graph.plan.shapes[(blur.id, "Out")] == Shape.of(h, w)


def test_a_shape_that_does_not_hold_the_buffer_or_comes_with_an_array_is_refused(engine: Any) -> None:  # noqa: F811
    import numpy as np

    buf = GpuBuffer(_Pool(), DType.UCHAR4, 100, stream=None)
    blur = engine.add(Blur(name="blur", Format="rgba8"))
    with pytest.raises(BindingError, match="does not describe 100 elements"):
        engine.bind(blur, "In", buf, shape=Shape.of(10, 11))
    with pytest.raises(BindingError, match="shape of its own"):
        engine.bind(blur, "In", np.zeros((10, 10, 4), np.uint8), shape=Shape.of(10, 10))
    engine.bind(blur, "In", buf, shape=Shape.of(100))  # 1-D: flat, as without a shape
    assert engine.context.snapshot().bindings[(blur.id, "In")].shape is None
