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
    assert "wave.Out (fused): 1 x float" in out and "[1] fused kernel expression (sum) grid 16x256" in out
    assert "wave_Freq=6.0" not in out and "Freq=6.0" in out and "Factor=2.0" in out


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
