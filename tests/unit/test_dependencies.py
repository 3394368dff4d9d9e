"""pyproject.toml's dependency lists against what the package imports.

Every module outside the standard library that ``cudapatch/`` imports (statically, or by name
through ``importlib``) comes from a requirement: a core dependency, or an extra's when only an
optional feature needs it. A core dependency nothing imports is a stale one; an extra's module must
not be needed by ``import cudapatch``, the CLI or the patch loader, which is checked in a fresh
interpreter that refuses to import the extras' modules.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cudapatch"

# Top-level module -> (requirement name, where pyproject lists it: "core" or the extra).
SOURCES = {
    "numpy": ("numpy", "core"),
    "pluggy": ("pluggy", "core"),
    "cuda": ("cuda-bindings", "core"),  # cuda.bindings; cuda.pathfinder comes with cuda-bindings 13
    "cupy": ("cupy-cuda13x", "core"),
    "nvmath": ("nvmath-python", "core"),  # imported by name (blocks/libraries.py nvmath_module)
    "tomlkit": ("tomlkit", "core"),
    "OpenGL": ("PyOpenGL", "gl"),
    "glfw": ("glfw", "gl"),
    "imgui_bundle": ("imgui-bundle", "gl"),
    "numba": ("numba-cuda", "numba"),
}
OPTIONAL = sorted(top for top, (_, where) in SOURCES.items() if where != "core")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!;~ ]", requirement, maxsplit=1)[0].lower()


def _imported_modules() -> dict[str, str]:
    """Top-level modules outside the standard library that the package imports -> a file that does."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=where)
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args:
                arg = node.args[0]  # importlib.import_module("x") or f"x.{...}"
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names = [arg.value]
                elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                    names = [str(arg.values[0].value)]
            for name in names:
                top = name.split(".")[0]
                if top and top != "cudapatch" and top not in sys.stdlib_module_names:
                    found.setdefault(top, where)
    return found


def test_every_imported_module_comes_from_a_listed_requirement():
    imported = _imported_modules()
    unknown = {top: where for top, where in imported.items() if top not in SOURCES}
    assert not unknown, f"imported but not traced to a requirement: {unknown} (add it to pyproject and SOURCES)"
    project = _project()
    lists = {"core": project["dependencies"], **project["optional-dependencies"]}
    for top, (requirement, where) in SOURCES.items():
        assert requirement.lower() in {_name(r) for r in lists[where]}, f"{top}: {requirement} not in {where}"


def test_every_core_dependency_is_imported():
    imported = _imported_modules()
    core = {_name(r) for r in _project()["dependencies"]}
    used = {requirement.lower() for top, (requirement, where) in SOURCES.items() if top in imported}
    assert core <= used, f"core dependencies nothing imports: {sorted(core - used)}"


def test_the_test_extras_hold_the_optional_packages_the_tests_use():
    extras = _project()["optional-dependencies"]
    for top in OPTIONAL:
        requirement, where = SOURCES[top]
        for extra in ("test", "dev"):
            assert requirement.lower() in {_name(r) for r in extras[extra]}, f"{requirement} not in [{extra}]"


def test_the_package_imports_without_the_optional_packages():
    """``import cudapatch``, the CLI and the patch loader, with the extras' modules refused."""
    probe = f"""
import sys
from importlib.abc import MetaPathFinder

class Refuse(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {OPTIONAL!r}:
            raise ImportError(f"{{name}} refused: an optional package")
        return None

sys.meta_path.insert(0, Refuse())
import cudapatch, cudapatch.cli, cudapatch.host_plugin
from cudapatch.host_plugin import PluginHost, load_patch
from cudapatch.host_plugin.hosts.standalone import demo_patch_text
assert "cudapatch" in repr(cudapatch)
print(len(list(PluginHost().registry)), len(demo_patch_text()))
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT, env=_env()
    )
    assert out.returncode == 0, out.stderr
    blocks, demo = (int(x) for x in out.stdout.split())
    assert blocks > 0 and demo > 0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env
