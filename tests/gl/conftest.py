"""Fixtures for GL tests: a headless EGL context (Mesa in CI, the NVIDIA driver on the GPU machine)."""

from __future__ import annotations

import os

import pytest

from ..gpu.conftest import engine, rng  # noqa: F401 - the GPU suite's fixtures, shared


@pytest.fixture
def egl():
    from cudapatch.interop import EglContext

    ctx = EglContext(320, 200)
    yield ctx
    ctx.close()


@pytest.fixture
def gl_engine(engine, request):  # noqa: F811 - ``engine`` is the fixture imported above
    """The GPU suite's engine and a headless GL context on its device: ``(engine, ctx)``. The context is
    640 x 360 unless the test's module sets ``GL_SIZE = (width, height)``."""
    from cudapatch.interop import EglContext

    ctx = EglContext(*getattr(request.module, "GL_SIZE", (640, 360)))
    engine.device.make_current()
    yield engine, ctx
    ctx.close()


@pytest.fixture
def needs_display():
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        pytest.skip("no display here: window tests run under Xvfb in CI (.ci/run)")
