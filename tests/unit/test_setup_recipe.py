"""docs/setup.md's TouchDesigner recipe, run as written: ``pip install --target "<that folder>"
/path/to/cudapatch`` installs cudapatch from a checkout, with its dependencies from the package index,
into a folder that a bare interpreter (a venv without packages, like TouchDesigner's Python) then
imports everything from. ``python3.11`` is this interpreter (the recipe's version is the host's),
``<that folder>`` a temporary folder and ``/path/to/cudapatch`` a copy of the checkout (the build
writes beside the sources). Needs the package index: it skips where pip cannot reach it.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from .test_plugin_package import (  # noqa: F401 (package_index, unchanged_environment: fixtures, used by name)
    ROOT,
    bare_environment,
    copy_checkout,
    package_index,
    unchanged_environment,
)

# cudapatch and each of its dependencies (pyproject's ``dependencies``), as modules
MODULES = ("cudapatch", "numpy", "pluggy", "cuda.bindings", "cupy", "nvmath", "tomlkit")

# Where each module is found, without importing the CUDA ones (no driver needed); then cudapatch
# imported for real, with the demo patch it ships as package data.
PROBE = """
import importlib.util, json, sys
found = {name: importlib.util.find_spec(name).origin for name in sys.argv[1:]}
import cudapatch, cudapatch.host_plugin.hosts.standalone as standalone
print(json.dumps({"found": found, "cudapatch": cudapatch.__file__, "demo": len(standalone.demo_patch_text())}))
"""


def _checkout_recipe() -> list[str]:
    """The words of the setup page's ``pip install --target`` line that installs from a checkout."""
    setup = (ROOT / "docs" / "setup.md").read_text(encoding="utf-8")
    section = setup[setup.index("## Into another application's Python") :]
    blocks = [body for lang, body in re.findall(r"^```(\w+)\n(.*?)^```", section, re.S | re.M) if lang == "bash"]
    (line,) = [
        line
        for block in blocks
        for line in block.splitlines()
        if "--target" in line and line.endswith(" /path/to/cudapatch")
    ]
    return shlex.split(line)


def test_the_recipe_is_a_pip_install_into_a_folder_from_a_checkout():
    words = ["python3.11", "-m", "pip", "install", "--target", "<that folder>", "/path/to/cudapatch"]
    assert _checkout_recipe() == words


@pytest.mark.usefixtures("package_index", "unchanged_environment")
def test_installing_from_the_checkout_path_into_a_folder(tmp_path: Path) -> None:
    target, checkout = tmp_path / "td-modules", copy_checkout(tmp_path / "cudapatch")
    stand_ins = {"python3.11": sys.executable, "<that folder>": str(target), "/path/to/cudapatch": str(checkout)}
    cmd = [stand_ins.get(word, word) for word in _checkout_recipe()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=bare_environment())
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]

    venv.create(tmp_path / "bare", with_pip=False)  # no packages of its own: only the folder has them
    python = tmp_path / "bare" / "bin" / "python"
    env = dict(bare_environment(), PYTHONPATH=str(target))
    out = subprocess.run(
        [str(python), "-c", PROBE, *MODULES], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    outside = {name: where for name, where in result["found"].items() if not Path(where).is_relative_to(target)}
    assert outside == {}, "not installed into the folder"
    assert Path(result["cudapatch"]).is_relative_to(target) and result["demo"] > 0
