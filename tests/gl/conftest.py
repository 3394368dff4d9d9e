"""Fixtures for GL tests: a headless EGL context (Mesa in CI, the NVIDIA driver on the GPU machine)."""

from __future__ import annotations

import os

import pytest

from ..gpu.conftest import engine  # noqa: F401 - the GPU suite's engine fixture, shared


@pytest.fixture
def egl():
    from cudapatch.interop import EglContext

    ctx = EglContext(320, 200)
    yield ctx
    ctx.close()


@pytest.fixture
def needs_display():
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        pytest.skip("no display here: window tests run under Xvfb in CI (.ci/run)")
