"""Helpers for unit tests: kernels written as PTX + VL.CudaGraph-style sidecars in a temp dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .recording_driver import RecordingDriver, install


def ptx_entry(name: str, params: list[str]) -> str:
    """A minimal PTX module with one entry whose parameters are the given PTX declarations."""
    decls = ",\n".join(f"\t.param {p} {name}_param_{i}" for i, p in enumerate(params))
    return (
        "//\n// hand-written for tests\n//\n\n.version 8.0\n.target sm_75\n.address_size 64\n\n"
        f"\t// .globl\t{name}\n.visible .entry {name}(\n{decls}\n)\n{{\n\tret;\n}}\n"
    )


def write_kernel(tmp: Path, name: str, ptx_params: list[str], sidecar: dict | str, *, stem: str | None = None) -> Path:
    """Write ``stem.ptx`` and ``stem.json``; returns the PTX path."""
    stem = stem or name
    ptx = tmp / f"{stem}.ptx"
    ptx.write_text(ptx_entry(name, ptx_params))
    text = sidecar if isinstance(sidecar, str) else json.dumps(sidecar, indent=2)
    (tmp / f"{stem}.json").write_text(text)
    return ptx


@pytest.fixture
def kernel_dir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def rec(monkeypatch: pytest.MonkeyPatch) -> RecordingDriver:
    """The recording driver in place of cuda-bindings' ``cu*`` functions (a test module that needs
    another stand-in driver defines its own ``rec``)."""
    return install(monkeypatch, RecordingDriver())
