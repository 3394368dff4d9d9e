"""``cudapatch plan patch.toml``: the compiled plan printed without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudapatch.cli import main
from cudapatch.host_plugin.plan_view import PlanEngine, format_plan, plan_patch

PATCH = """\
links = ["src.Out -> wave.x", "wave.Out -> gain.In", "gain.Out -> sum.A", "src.Out -> sum.B"]

[operators.src]
type = "core.Fill"
Count = 4096
Value = 0.5

[operators.wave]
type = "core.Expression"
Code = "sin(x * Freq) * 0.5 + 0.5"
Freq = 6.0

[operators.gain]
type = "core.Scale"
Factor = 2.0

[operators.sum]
type = "core.VectorAdd"
"""


@pytest.fixture
def patch_file(tmp_path: Path) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(PATCH)
    return path


def test_plan_lists_blocks_buffers_nodes_and_edges(patch_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(patch_file), "--no-fuse"]) == 0
    out = capsys.readouterr().out
    assert "4 blocks running" in out
    for line in ("wave             Expression", "[1] wave.Out: 4096 x float", "Freq=6.0", "[0] -> [3]", "[2] -> [3]"):
        assert line in out, line
    assert "kernel expression (wave) grid 16x256" in out


def test_plan_engine_compiles_what_the_adapter_built(patch_file: Path) -> None:
    engine, plan = plan_patch(patch_file, fuse=False)
    assert isinstance(engine, PlanEngine) and plan is not None
    assert len(plan.kernel_nodes) == 4 and not plan.diagnostics
    assert format_plan(engine, plan).startswith("plan: 4 blocks running")


def test_a_bad_patch_prints_the_line_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(PATCH.replace('Code = "sin(x * Freq) * 0.5 + 0.5"', 'Code = "sin(x * Freq) * "'))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml:" in err and "column" in err


def test_an_unlinked_input_shows_as_not_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.toml"
    path.write_text(PATCH.replace('"src.Out -> wave.x", ', ""))
    assert main(["plan", str(path), "--no-fuse"]) == 0
    out = capsys.readouterr().out
    assert "wave             not running" in out and "required input 'x' is not linked" in out


def test_plan_shows_fused_groups(patch_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(patch_file)]) == 0
    out = capsys.readouterr().out
    assert "2 nodes (2 kernels)" in out and "fused groups: 1" in out
    assert "node [1]: wave -> gain -> sum" in out
    assert "wave: sin(x * Freq) * 0.5 + 0.5" in out and "gain: fma(In, Factor, Offset)" in out
    assert "wave.Out (fused): 1 x float" in out and "[1] fused kernel expression (sum) grid 32x128" in out
    assert "wave_Freq=6.0" not in out and "Freq=6.0" in out and "Factor=2.0" in out


def test_the_patch_files_engine_fuse_setting_is_the_default_and_no_fuse_wins(tmp_path: Path) -> None:
    links, rest = PATCH.split("\n", 1)
    path = tmp_path / "p.toml"
    path.write_text(f"{links}\n[engine]\nfuse = false\n{rest}")
    _, plan = plan_patch(path)
    assert plan is not None and len(plan.kernel_nodes) == 4  # the file turns fusion off
    path.write_text(f'{links}\n[engine]\nfuse = true\nkeep = ["gain.Out"]\n{rest}')
    _, plan = plan_patch(path)
    assert plan is not None and len(plan.kernel_nodes) == 3  # src, wave -> gain fused, sum: gain.Out is kept
    (fused,) = [n for n in plan.kernel_nodes if getattr(n.source, "members", ())]
    assert fused.block_id in {bid for bid, port in plan.outputs if port == "Out"}  # gain's output has its buffer
    _, plan = plan_patch(path, fuse=False)  # --no-fuse
    assert plan is not None and len(plan.kernel_nodes) == 4


def test_a_fuse_setting_that_is_no_boolean_is_an_error_with_its_line(tmp_path: Path) -> None:
    from cudapatch.errors import PatchFileError
    from cudapatch.host_plugin import PluginHost
    from cudapatch.host_plugin.patch import parse_patch

    with pytest.raises(PatchFileError, match="fuse = 'no': write true or false") as err:
        parse_patch('[engine]\nfuse = "no"\n', registry=PluginHost().registry)
    assert err.value.line == 2


def test_the_standalone_host_makes_its_engine_with_the_patchs_fuse_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudapatch.engine import engine as engine_module
    from cudapatch.host_plugin.hosts.standalone import StandaloneHost
    from tests.unit.plan_engine import PlanOnlyEngine

    made: list[tuple[bool, dict]] = []

    class RecordingEngine(PlanOnlyEngine):  # the editing API with no device; records what it was made with
        def __init__(self, device: int = 0, *, name: str = "", isolated: bool = False, **options: bool) -> None:
            super().__init__(fuse=options.get("fuse", True))
            made.append((isolated, options))

    monkeypatch.setattr(engine_module, "Engine", RecordingEngine)
    links, rest = PATCH.split("\n", 1)
    path = tmp_path / "p.toml"
    path.write_text(f"{links}\n[engine]\nfuse = false\n{rest}")
    StandaloneHost(path)
    StandaloneHost(path, isolated=True)
    path.write_text(PATCH)
    StandaloneHost(path)
    StandaloneHost(path, fuse=False)  # cudapatch run --no-fuse
    assert made == [
        (False, {"fuse": False, "reuse_buffers": True}),
        (True, {"fuse": False}),  # the isolated engine takes fuse too (its child never shares buffers)
        (False, {"fuse": True, "reuse_buffers": True}),
        (False, {"fuse": False, "reuse_buffers": True}),
    ]


def test_plan_shows_region_bodies_under_their_conditional_nodes() -> None:
    """``cudapatch plan`` on a patch with regions: the reaction-diffusion example's For, unrolled, with
    its FrameDelay carried by ping-pong (the copies alternate the two buffers) and synced once after."""
    path = Path(__file__).resolve().parents[2] / "examples" / "10_reaction_diffusion.toml"
    engine, plan = plan_patch(path, fuse=False)
    assert plan is not None
    text = format_plan(engine, plan)
    assert "while conditional (Steps), body:" in text
    body = [line for line in text.splitlines() if line.startswith("    [") and "gray_scott" in line]
    assert len(body) == 8 + 2 + 1  # the main body, the pairs' tail, the tail of one
    assert "(buf1, buf2," in body[0] and "(buf2, buf1," in body[1]
    assert "delay_sync4 (field)" in text and "delay_copy" not in text
