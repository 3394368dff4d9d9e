"""Packaging, without touching the environment the tests run in.

The third-party plugin example is found through its entry point: for the tests' duration its
source folder and a ``.dist-info`` made from its ``pyproject.toml`` go on ``sys.path`` (and on
``PYTHONPATH`` for the CLI), which is all ``importlib.metadata`` needs. The install recipe the docs
give for TouchDesigner (``pip install --target``) is run on a wheel built from the checkout, into a
temporary folder, without the package index. The plugin README's recipe runs as written in a
temporary environment (a venv that sees this one's packages) and needs the package index for the
build backend: it skips where the index cannot be reached. Each test that runs pip checks, from a
fresh interpreter, that this environment lists after it what it listed before it (no
``example.Wave`` left behind), whichever order the tests run in.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from cudapatch.host_plugin import PluginHost, load_patch, parse_patch

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "examples" / "plugin_package"
MODULE = "cudapatch_example_plugin"


def _dist_info(target: Path) -> Path:
    """A ``.dist-info`` folder declaring what the example's ``pyproject.toml`` declares."""
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    name, version = project["name"], project["version"]
    info = target / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    lines = ["[cudapatch]"] + [f"{k} = {v}" for k, v in project["entry-points"]["cudapatch"].items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


# What a fresh interpreter of the test environment sees of the example plugin: its distribution,
# the ``cudapatch`` entry points, and whether ``cudapatch blocks`` would list its block type.
_PROBE = """
import importlib.metadata as m, json
from cudapatch.host_plugin import PluginHost
names = {(d.metadata["Name"] or "").lower() for d in m.distributions()}
print(json.dumps({
    "distribution": "cudapatch-example-plugin" in names,
    "entry_points": sorted(f"{e.name} = {e.value}" for e in m.entry_points(group="cudapatch")),
    "wave": "example.Wave" in PluginHost().registry,
}))
"""


def _environment() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("CUDAPATCH_DISABLE_PLUGINS", None)
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT.parent
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture
def unchanged_environment():
    """For a test that runs pip: this environment, probed before the test, is the same after it."""
    before = _environment()
    yield
    assert _environment() == before, "the test changed the environment the tests run in"


@pytest.fixture(scope="session")
def package_index(tmp_path_factory) -> None:
    """Skip unless pip can fetch from the package index (the build backend, for isolated builds)."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--timeout", "15", "--retries", "0"]
    where = tmp_path_factory.mktemp("index-probe")
    out = subprocess.run([*cmd, "-d", str(where), "setuptools>=77"], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        pytest.skip(f"the package index cannot be reached (offline?): {out.stderr.strip().splitlines()[-1:]}")


def copy_checkout(dest: Path, *more: str) -> Path:
    """What pip reads of the checkout (and the folders ``more`` names), copied to ``dest``: a build
    writes build/ and *.egg-info beside the sources, which must not land in the checkout."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for folder in ("cudapatch", *more):
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


def bare_environment() -> dict[str, str]:
    """This process's environment for a command that must see only what is installed (no PYTHONPATH
    pointing at the checkout, no plugin disabled)."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "CUDAPATCH_DISABLE_PLUGINS"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """The example plugin importable and registered as an entry point until the module's tests end."""
    meta = _dist_info(tmp_path_factory.mktemp("plugin-meta"))
    with pytest.MonkeyPatch.context() as mp:
        # An installed copy (an older environment may have one) must not stand in for the checkout's.
        mp.delitem(sys.modules, MODULE, raising=False)
        mp.syspath_prepend(str(PACKAGE))
        mp.syspath_prepend(str(meta))
        importlib.invalidate_caches()
        yield os.pathsep.join([str(meta), str(PACKAGE)])
        sys.modules.pop(MODULE, None)
    importlib.invalidate_caches()


def test_plugin_is_loaded_from_its_entry_point(plugin_path):
    host = PluginHost()
    bt = host.registry.get("example.Wave")
    assert bt.origin == "example" and bt.version == "0.1.0"
    assert ("out", "Out", "float[]") in bt.ports and ("Frequency", "float", 1.0) in bt.params
    assert Path(sys.modules[MODULE].__file__).is_relative_to(PACKAGE)  # the checkout's source
    patch = parse_patch('[operators.w]\ntype = "example.Wave"\nFrequency = 3.0\n', registry=host.registry)
    assert patch.operators["w"].type == "example.Wave"


def test_the_example_patch_loads(plugin_path):
    patch = load_patch(PACKAGE / "wave.toml", registry=PluginHost().registry)
    assert patch.operators["wave"].type == "example.Wave" and patch.links


def test_the_plugin_ships_a_composite_as_a_file(plugin_path):
    from cudapatch.host_plugin import HostAdapter
    from tests.unit.plan_engine import PlanOnlyEngine

    host = PluginHost()
    assert host.errors == []
    bt = host.registry.get("example.Chorus")
    assert bt.origin == "example" and bt.version == "0.1.0"
    assert ("out", "Out", "float[]") in bt.ports
    assert [p[0] for p in bt.params] == ["Count", "Frequency", "Detune", "ChildGraph"] and (
        "Detune",
        "float",
        3.1,
    ) in bt.params
    patch = parse_patch('[operators.c]\ntype = "example.Chorus"\nDetune = 3.3\n', registry=host.registry)
    assert patch.operators["c"].params == {"Detune": 3.3}
    engine = PlanOnlyEngine()
    chorus = HostAdapter(engine, host.registry).create("c", "example.Chorus", {"Count": 256, "Detune": 3.3})
    engine.update()
    assert engine.errors == ()
    assert [b.name for b in engine.context.snapshot().blocks] == ["c/a", "c/b", "c/sum"]
    sizes = {b.count for b in engine.plan.buffers}
    assert sizes == {256} and (chorus.id, "Out") in engine.plan.outputs


def test_cli_lists_the_plugin_block(plugin_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([plugin_path, str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-m", "cudapatch", "blocks"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PACKAGE.parents[1],
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "example.Wave  (v0.1.0, from example)" in out.stdout and "par Frequency: float = 1.0" in out.stdout
    assert "example.Chorus  (v0.1.0, from example)" in out.stdout


def test_disabling_the_plugin_by_name(plugin_path, monkeypatch):
    monkeypatch.setenv("CUDAPATCH_DISABLE_PLUGINS", "example")
    assert "example.Wave" not in PluginHost().registry


def _offline_wheel_builds() -> bool:
    """setuptools builds wheels itself from 70.1 on and reads pyproject's SPDX license string from 77 on."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor) >= (77, 0)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if not _offline_wheel_builds():
        pytest.skip("building a wheel offline needs setuptools>=77 (in the test extra)")
    src = copy_checkout(tmp_path_factory.mktemp("checkout"))
    dist = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    out = subprocess.run([*cmd, "-w", str(dist), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (found,) = dist.glob("cudapatch-*.whl")
    return found


def test_the_wheel_states_its_license_as_an_spdx_expression(wheel):
    # The table form (license = {text = ...}) makes setuptools print a deprecation block on every install
    # with a current pip, and setuptools stops building it after 2027-02-18.
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = zf.read(name).decode()
    assert "License-Expression: MIT" in metadata.splitlines()


def test_a_wheel_of_the_checkout_installs_into_a_target_folder(wheel, tmp_path, unchanged_environment):
    assert wheel.name == "cudapatch-0.1.0-py3-none-any.whl"  # the name docs/setup.md gives
    target = tmp_path / "td-modules"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(wheel)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    pkg = target / "cudapatch"
    for data in ("py.typed", "kernels/ptx/scale.ptx", "kernels/ptx/scale.json", "host_plugin/hosts/demo.toml"):
        assert (pkg / data).is_file(), data
    probe = (
        "import cudapatch, cudapatch.host_plugin.hosts.standalone as s; "
        "print(cudapatch.__file__); print(len(s.demo_patch_text()))"
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    where, size = out.stdout.split()
    assert Path(where).is_relative_to(target) and int(size) > 0


def _readme_commands() -> list[str]:
    """The command lines of the plugin README's bash block, without their comments."""
    text = (PACKAGE / "README.md").read_text(encoding="utf-8")
    (block,) = [body for lang, body in re.findall(r"^```(\w+)\n(.*?)^```", text, re.S | re.M) if lang == "bash"]
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


def test_the_readme_installs_cudapatch_before_the_plugin():
    commands = _readme_commands()
    assert commands[:2] == ["python3 -m pip install -e .", "python3 -m pip install ./examples/plugin_package"]
    assert commands[2:] == ["cudapatch blocks", "cudapatch run examples/plugin_package/wave.toml"]


def test_the_readme_recipe_runs_in_a_temporary_environment(package_index, unchanged_environment, tmp_path):
    """The README's lines, as written, in a copy of the checkout and a venv of their own. The venv
    sees this environment's packages, so pip takes cudapatch's dependencies from here and fetches only
    the build backend; the plugin's ``cudapatch`` requirement is met by the line before it."""
    checkout = copy_checkout(tmp_path / "checkout", "examples/plugin_package")
    venv.create(tmp_path / "venv", system_site_packages=True, with_pip=True)
    bin_dir = tmp_path / "venv" / ("Scripts" if os.name == "nt" else "bin")
    programs = {"python3": str(bin_dir / "python"), "cudapatch": str(bin_dir / "cudapatch")}
    env = bare_environment()
    run = {}
    for line in _readme_commands():
        words = shlex.split(line)
        if words[:2] == ["cudapatch", "run"]:  # needs a GPU and opens a window: its patch is loaded below
            patch = words[2]
            continue
        out = subprocess.run(
            [programs[words[0]], *words[1:]], capture_output=True, text=True, timeout=600, cwd=checkout, env=env
        )
        assert out.returncode == 0, f"{line}\n{out.stdout}{out.stderr}"
        run[line] = out.stdout
    assert "example.Wave  (v0.1.0, from example)" in run["cudapatch blocks"]
    probe = (
        "import sys, cudapatch, cudapatch_example_plugin as p\n"
        "from cudapatch.host_plugin import PluginHost, load_patch\n"
        "patch = load_patch(sys.argv[1], registry=PluginHost().registry)\n"
        "print(cudapatch.__file__); print(p.__file__); print(patch.operators['wave'].type)\n"
    )
    out = subprocess.run(
        [programs["python3"], "-c", probe, patch], capture_output=True, text=True, timeout=120, cwd=checkout, env=env
    )
    assert out.returncode == 0, out.stderr
    package, plugin, wave = out.stdout.split()
    assert Path(package).is_relative_to(checkout)  # the editable install of the copy, not this environment's
    assert Path(plugin).is_relative_to(tmp_path / "venv") and wave == "example.Wave"
