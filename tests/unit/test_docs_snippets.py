"""The snippets in README.md, docs/*.md and examples/*/README.md: every TOML snippet loads as a patch
(or a composite file) and plans as the engine would plan it (with the kernel files it names, found
in the page's folder or an examples/ folder; an example plugin's README with that plugin's blocks); every Python snippet
compiles, imports only what exists, uses no name it does not define and imports nothing it leaves
unused. (Running the Python snippets needs a GPU: tests/examples run them there.) Also the pages'
claims about the project: the Python floor, the CUDA 12 recipe, the environment variables."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import sys
import tomllib
from pathlib import Path

import pytest

from cudapatch.host_plugin import (
    BlockTypeRegistry,
    HostAdapter,
    PluginHost,
    apply_patch,
    make_plugin_manager,
    parse_composite,
    parse_patch,
)

from .plan_engine import PlanOnlyEngine

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_PAGES = sorted((ROOT / "examples").glob("*/README.md"))
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *EXAMPLE_PAGES]
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
_OPENING = re.compile(r"^```(.*)$", re.M)  # every fence line; an opening one carries the language
LANGUAGES = {"python", "toml", "bash"}  # a snippet in another language would be checked by nothing here


def _snippets(lang: str) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            if m.group(1) == lang:
                line = text.count("\n", 0, m.start()) + 1
                found.append((f"{page.relative_to(ROOT)}:{line}", m.group(2)))
    return found


PYTHON = _snippets("python")
TOML = _snippets("toml")


def test_the_pages_have_snippets_to_check():
    readme = [where for where, _ in PYTHON if where.startswith("README.md")]
    assert len(readme) >= 2  # one patch in code, one block
    assert TOML


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8")) <= 8000


def test_every_fenced_snippet_is_in_a_checked_language():
    for page in PAGES:
        fences = _OPENING.findall(page.read_text(encoding="utf-8"))
        openings = fences[::2]  # fences pair up: opening, closing
        assert len(fences) % 2 == 0 and not any(fences[1::2]), f"{page.name}: unpaired fences"
        unknown = {lang for lang in openings if lang and lang not in LANGUAGES}
        assert not unknown, (
            f"{page.relative_to(ROOT)}: snippets in {unknown} (check them here, or use one of {LANGUAGES})"
        )


@pytest.fixture
def page_registry(monkeypatch):
    """The block types a snippet of a page may use: the built-ins and the installed plugins, plus, on an
    example plugin's README, that plugin (imported from its folder for the test, as its entry point would)."""

    def registry(where: str) -> BlockTypeRegistry:
        folder = (ROOT / where.split(":")[0]).parent
        project = folder / "pyproject.toml"
        if not project.is_file():
            return PluginHost().registry
        modules = tomllib.loads(project.read_text(encoding="utf-8"))["project"]["entry-points"]["cudapatch"]
        monkeypatch.syspath_prepend(str(folder))
        plugins = []
        for name, module in modules.items():
            # The module's entry in sys.modules (or its absence) comes back after the test; none now, so the
            # import reads the plugin's folder, not an installed copy.
            monkeypatch.setitem(sys.modules, module, None)
            del sys.modules[module]
            plugins.append((name, importlib.import_module(module)))
        return PluginHost(make_plugin_manager(plugins=tuple(plugins))).registry

    return registry


@pytest.mark.parametrize(("where", "text"), TOML, ids=[w for w, _ in TOML])
def test_toml_snippets_load_as_patches(where, text, page_registry):
    registry = page_registry(where)
    if "[expose]" in text:  # a composite file (docs/composites.md): a patch with what it exposes
        patch = parse_composite(text, path=where, registry=registry).patch
    else:
        patch = parse_patch(text, path=where, registry=registry)
    assert patch.operators
    if "[expose]" in text:
        return  # a composite plans inside a patch that uses it (the next snippet on its page)
    files = {op.params["Path"] for op in patch.operators.values() if "Path" in op.params}
    folder = _folder_holding(where, files)
    assert folder is not None, f"{where}: no folder holds the files it names: {sorted(files)}"
    engine = PlanOnlyEngine()
    apply_patch(HostAdapter(engine, registry, search_paths=[folder]), patch)
    engine.update()
    assert engine.errors == () and engine.plan is not None, f"{where}: {engine.errors}"
    assert len(engine.context.snapshot().blocks) >= len(patch.operators)


def _folder_holding(where: str, files: set[str]) -> Path | None:
    """The page's folder when it has every file the snippet names (or it names none), else examples/
    or a folder in it that has them all."""
    page_folder = (ROOT / where.split(":")[0]).parent
    examples = ROOT / "examples"
    for folder in [page_folder, examples, *sorted(p for p in examples.rglob("*") if p.is_dir())]:
        if all((folder / name).is_file() for name in files):
            return folder
    return None


def test_the_plugin_example_readme_shows_the_patch_it_ships():
    """examples/plugin_package/README.md quotes wave.toml; test_plugin_package.py loads the file."""
    package = ROOT / "examples" / "plugin_package"
    (quoted,) = [
        text for lang, text in _FENCE.findall((package / "README.md").read_text(encoding="utf-8")) if lang == "toml"
    ]
    shipped = (package / "wave.toml").read_text(encoding="utf-8")
    body = "".join(line for line in shipped.splitlines(keepends=True) if not line.startswith("#"))
    assert quoted.strip() == body.strip()


def _bound_and_loaded(tree: ast.AST) -> tuple[set[str], set[str], dict[str, int]]:
    """Names a module binds anywhere, names it reads, and its imported names (name -> line)."""
    bound: set[str] = set()
    loaded: set[str] = set()
    imported: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                bound.add(name)
                imported[name] = node.lineno
        elif isinstance(node, ast.Attribute):
            base = node
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name):
                loaded.add(base.id)
    return bound, loaded, imported


@pytest.mark.parametrize(("where", "text"), PYTHON, ids=[w for w, _ in PYTHON])
def test_python_snippets_compile_and_their_names_resolve(where, text):
    tree = ast.parse(text, filename=where)
    compile(tree, where, "exec")
    bound, loaded, imported = _bound_and_loaded(tree)
    undefined = sorted(loaded - bound - set(dir(builtins)) - {"__file__"})  # pasted into a file: it has one
    assert not undefined, f"{where}: used but never defined or imported: {undefined}"
    unused = sorted(name for name in imported if name not in loaded)
    assert not unused, f"{where}: imported but unused: {unused}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{where}: relative import"
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule, or ImportError


def test_cuda12_recipe_installs_what_the_libs_cu12_extra_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    setup = (ROOT / "docs" / "setup.md").read_text(encoding="utf-8")
    recipe = next(block for lang, block in _FENCE.findall(setup) if lang == "bash" and "cupy-cuda12x" in block)
    for requirement in project["optional-dependencies"]["libs-cu12"]:
        assert f'"{requirement}"' in recipe
    for requirement in project["dependencies"]:  # every dependency, in its CUDA 12 build where it has one
        name = re.split(r"[\[<>=;~ ]", requirement, maxsplit=1)[0]
        cu12 = {"cuda-bindings": '"cuda-bindings[all]>=12.9,<13"', "cupy-cuda13x": "cupy-cuda12x"}
        assert cu12.get(name, name) in recipe, name
    assert "tools/build_kernels.py --nvrtc" in recipe  # CUDA 12's nvJitLink refuses the bundled PTX (ISA 9.0)


def test_requires_python_matches_the_docs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    floor = project["requires-python"].removeprefix(">=")
    assert f"Python ≥ {floor}" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"Python {floor} or newer" in (ROOT / "docs" / "setup.md").read_text(encoding="utf-8")


def test_every_environment_variable_the_package_reads_is_documented():
    """Each CUDAPATCH_* name in the package is in docs/setup.md's tables, and each name there is read."""
    read = set()
    for path in (ROOT / "cudapatch").rglob("*.py"):
        read |= set(re.findall(r"\bCUDAPATCH_[A-Z][A-Z_]*[A-Z]\b", path.read_text(encoding="utf-8")))
    assert {"CUDAPATCH_GL_CHECKS", "CUDAPATCH_PROGRAMMATIC_EDGES", "CUDAPATCH_CACHE_DIR"} <= read
    setup = (ROOT / "docs" / "setup.md").read_text(encoding="utf-8")
    section = setup[setup.index("## Environment variables") :]
    documented = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            documented |= set(re.findall(r"`(CUDAPATCH_[A-Z_]+)[=`]", row.split(" | ")[0]))
    assert sorted(read - documented) == [], "read by the package, not in docs/setup.md's tables"
    assert sorted(documented - read) == [], "in docs/setup.md's tables, read nowhere"


def test_relative_links_point_at_files_that_exist():
    broken = []
    for page in PAGES:
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" not in link and not (page.parent / link).exists():
                broken.append(f"{page.relative_to(ROOT)}: {link}")
    assert not broken
