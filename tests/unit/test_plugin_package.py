"""The third-party plugin example: installed into the test environment, found through its entry point."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from cudapatch.host_plugin import PluginHost, parse_patch

PACKAGE = Path(__file__).resolve().parents[2] / "examples" / "plugin_package"


@pytest.fixture(scope="module")
def installed_plugin():
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", str(PACKAGE)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    importlib.invalidate_caches()
    yield
    # stays installed: it is part of the test environment, like the package under test


def test_plugin_is_loaded_from_its_entry_point(installed_plugin):
    host = PluginHost()
    bt = host.registry.get("example.Wave")
    assert bt.origin == "example" and bt.version == "0.1.0"
    assert ("out", "Out", "float[]") in bt.ports and ("Frequency", "float", 1.0) in bt.params
    patch = parse_patch('[operators.w]\ntype = "example.Wave"\nFrequency = 3.0\n', registry=host.registry)
    assert patch.operators["w"].type == "example.Wave"


def test_cli_lists_the_plugin_block(installed_plugin):
    out = subprocess.run(
        [sys.executable, "-m", "cudapatch", "blocks"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PACKAGE.parents[1],
    )
    assert out.returncode == 0, out.stderr
    assert "example.Wave  (v0.1.0, from example)" in out.stdout and "par Frequency: float = 1.0" in out.stdout


def test_disabling_the_plugin_by_name(installed_plugin, monkeypatch):
    monkeypatch.setenv("CUDAPATCH_DISABLE_PLUGINS", "example")
    assert "example.Wave" not in PluginHost().registry
