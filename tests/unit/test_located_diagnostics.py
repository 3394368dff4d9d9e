"""Errors found when a patch file is compiled, not loaded (a While without Max, a FrameDelay whose In
does not fit) are shown at the file and line of the operator that made the block: by ``cudapatch
plan``, by the standalone host's messages and status (what ``cudapatch run`` prints) and by the
overlay's list; an inner block of a composite file also names its line in that file."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudapatch.cli import main
from cudapatch.engine.diagnostics import Diagnostic
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
from cudapatch.host_plugin.places import located, operator_places
from cudapatch.interop.overlay import diagnostic_line

from .plan_engine import PlanOnlyEngine

REG = PluginHost().registry
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

DELAY = """\
links = [
    "fill.Out -> decay.In",
    "decay.Out -> delay.In",
    "delay.Out -> show.In",
]

[operators.fill]
type = "core.Fill"
Count = 256
Value = 0.5

[operators.decay]
type = "core.Scale"
Factor = 0.9

[operators.delay]                # holds 128 elements: In gets 256
type = "core.FrameDelay"
Count = 128
Fill = 1.0

[operators.show]
type = "core.Scale"
"""


def _line_of(text: str, table: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(f"[operators.{table}]"))


def _while_without_max(tmp_path: Path) -> tuple[Path, int]:
    """The Jacobi example's patch without its While's Max, written to ``tmp_path`` (kernels by absolute path)."""
    text = (EXAMPLES / "08_jacobi.toml").read_text().replace("Max = 20000", "")
    text = text.replace('Path = "jacobi/', f'Path = "{EXAMPLES.as_posix()}/jacobi/')
    path = tmp_path / "solve.toml"
    path.write_text(text)
    return path, _line_of(text, "Solve")


def _delay_mismatch(tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "loop.toml"
    path.write_text(DELAY)
    return path, _line_of(DELAY, "delay")


@pytest.fixture
def plan_only_host(monkeypatch: pytest.MonkeyPatch):
    """``StandaloneHost`` on the real adapter, patch loader and graph compiler, with an engine that
    plans without a device (``update()`` compiles at once)."""
    from cudapatch.engine import engine as engine_module
    from cudapatch.host_plugin.hosts.standalone import StandaloneHost

    class NoDeviceEngine(PlanOnlyEngine):
        def __init__(self, device: int = 0, *, name: str = "", isolated: bool = False, **options: bool) -> None:
            super().__init__(fuse=options.get("fuse", True))

    monkeypatch.setattr(engine_module, "Engine", NoDeviceEngine)

    def make(path: Path) -> StandaloneHost:
        host = StandaloneHost(path)
        host.engine.update()
        return host

    return make


@pytest.mark.parametrize(
    ("case", "code", "says"),
    [
        (_while_without_max, "region-max", "While 'Solve' needs Max"),
        (_delay_mismatch, "delay-mismatch", "FrameDelay 'delay': feedback size mismatch"),
    ],
)
def test_the_standalone_host_shows_a_compile_error_at_its_operators_line(
    tmp_path: Path, plan_only_host, case, code: str, says: str
) -> None:
    path, line = case(tmp_path)
    host = plan_only_host(path)
    assert any(d.code == code for d in host.engine.diagnostics())
    errors = host.messages("error")  # what `cudapatch run` prints, after "cudapatch: "
    assert any(m.startswith(f"{path}:{line}: {says}") for m in errors), errors
    assert f"{path}:{line}: {says}" in host.status  # the status line names the first error too
    assert host.status.startswith("patch loaded; ")


def test_a_patch_without_errors_keeps_its_status_and_has_no_error_messages(tmp_path: Path, plan_only_host) -> None:
    path = tmp_path / "loop.toml"
    path.write_text(DELAY.replace("Count = 128", "Count = 256"))
    host = plan_only_host(path)
    assert host.messages("error") == [] and host.status == "patch loaded"


@pytest.mark.parametrize(
    ("case", "says"),
    [(_while_without_max, "While 'Solve' needs Max"), (_delay_mismatch, "FrameDelay 'delay': feedback size")],
)
def test_cudapatch_plan_shows_a_compile_error_at_its_operators_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case, says: str
) -> None:
    path, line = case(tmp_path)
    main(["plan", str(path)])
    out = capsys.readouterr().out
    assert f"error: {path}:{line}: {says}" in out, out


def test_an_inner_block_of_a_composite_file_names_both_lines(tmp_path: Path) -> None:
    composite = """\
links = ["s.Out -> d.In"]

[composite]
name = "Echo"

[operators.s]
type = "core.Scale"

[operators.d]                    # 32 elements: In gets 64
type = "core.FrameDelay"
Count = 32

[expose]
In = "s.In"
Out = "d.Out"
"""
    patch = """\
links = ["fill.Out -> echo.In"]

[operators.fill]
type = "core.Fill"
Count = 64

[operators.echo]
type = "core.Composite"
Path = "echo.toml"
"""
    (tmp_path / "echo.toml").write_text(composite)
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG, search_paths=[tmp_path])
    loaded = parse_patch(patch, path=tmp_path / "p.toml", registry=REG)
    apply_patch(adapter, loaded)
    engine.update()
    (d,) = [d for d in engine.diagnostics() if d.code == "delay-mismatch"]
    places = operator_places(adapter, loaded)
    here = f"{tmp_path / 'p.toml'}:{_line_of(patch, 'echo')}"
    inner = f"{tmp_path / 'echo.toml'}:{_line_of(composite, 'd')}"
    assert located(d, places) == f"{here} ({inner}): {d.message}"
    assert places[adapter.block("echo").id] == here and places[adapter.block("fill").id].endswith("p.toml:3")


def test_a_diagnostic_without_a_place_keeps_its_message() -> None:
    engine_wide = Diagnostic("error", None, "cycle", "the engine is lost")
    of_a_block = Diagnostic("warning", 7, "delay-open", "FrameDelay 'd': 'In' is not linked")
    assert located(engine_wide, {7: "p.toml:3"}) == "the engine is lost"
    assert located(of_a_block, {}) == of_a_block.message
    assert located(of_a_block, {7: "p.toml:3"}) == "p.toml:3: FrameDelay 'd': 'In' is not linked"
    # the overlay's list: place, block name, message; the engine's own diagnostics stay "engine: ..."
    assert diagnostic_line(of_a_block, {7: "d"}, {7: "p.toml:3"}) == f"p.toml:3: d: {of_a_block.message}"
    assert diagnostic_line(of_a_block, {7: "d"}, {}) == f"d: {of_a_block.message}"
    assert diagnostic_line(engine_wide, {}, {7: "p.toml:3"}) == "engine: the engine is lost"
