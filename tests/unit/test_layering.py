"""The layering of DESIGN.md §1, enforced: imports point one way, host_plugin → engine → blocks →
kernels (interop beside the engine), and ``import cudapatch`` loads no GL or UI package.

Imports are read from the source with ``ast`` (every import, including those under
``TYPE_CHECKING`` and inside functions), because a runtime check cannot see them: importing any
submodule runs ``cudapatch/__init__.py``, which loads every layer.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import cudapatch

PACKAGE = Path(cudapatch.__file__).parent

#: Subpackage -> the subpackages none of its modules may import.
FORBIDDEN = {
    "kernels": ("blocks", "engine", "host_plugin", "interop", "expr"),
    "expr": ("blocks", "engine", "host_plugin", "interop"),
    "blocks": ("engine", "host_plugin", "interop"),
    "engine": ("host_plugin", "interop"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)  # ``from .. import engine``
    return out


def _modules(subpackage: str) -> list[Path]:
    return sorted((PACKAGE / subpackage).rglob("*.py"))


def test_the_import_reader_resolves_relative_imports() -> None:
    # The reader is what the layering rests on: a relative import it misread would pass silently.
    block = PACKAGE / "blocks" / "block.py"
    names = imported_modules(block)
    assert "cudapatch.blocks.builder" in names and "cudapatch.errors" in names
    assert "cudapatch.kernels.source" in names  # imported under TYPE_CHECKING
    assert "cudapatch.blocks.library" in imported_modules(PACKAGE / "blocks" / "__init__.py")


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_imports_point_one_way(layer: str) -> None:
    bad = [
        f"{path.relative_to(PACKAGE.parent)} imports {module}"
        for path in _modules(layer)
        for module in sorted(imported_modules(path))
        if any(module == f"cudapatch.{f}" or module.startswith(f"cudapatch.{f}.") for f in FORBIDDEN[layer])
    ]
    assert not bad, "\n".join(bad)


def test_blocks_import_nothing_from_the_engine() -> None:
    # The seam issue 17 asked for, stated on its own: blocks see the engine only as BlockHost and LibraryScope.
    modules = _modules("blocks")
    assert len(modules) > 10  # the walk found the package
    for path in modules:
        assert not any(m.startswith("cudapatch.engine") for m in imported_modules(path)), path


def test_import_cudapatch_loads_no_gl_or_ui_package() -> None:
    code = (
        "import sys, cudapatch\n"
        "roots = {m.split('.')[0] for m in sys.modules}\n"
        "bad = sorted(roots & {'glfw', 'imgui', 'imgui_bundle', 'OpenGL', 'moderngl'})\n"
        "assert not bad, bad\n"
        "assert not [m for m in sys.modules if m.startswith('cudapatch.interop')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
