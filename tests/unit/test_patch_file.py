"""Patch files: parsing with line-precise errors, and edits applied as differences."""

from __future__ import annotations

import pytest

from cudapatch.errors import PatchFileError
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, load_patch, parse_patch
from cudapatch.host_plugin.hosts.standalone import demo_patch_text

from .plan_engine import PlanOnlyEngine

REG = PluginHost().registry

BASE = """\
links = ["fill.Out -> scale.In"]

[engine]
profiling = "PerBlock"

[operators.fill]
type = "core.Fill"
Count = 128
Value = 0.5

[operators.scale]
type = "core.Scale"
Factor = 2.0
"""


def _err(text: str) -> PatchFileError:
    with pytest.raises(PatchFileError) as exc:
        parse_patch(text, path="p.toml", registry=REG)
    return exc.value


def test_demo_patch_is_valid():
    p = parse_patch(demo_patch_text(), registry=REG)
    assert set(p.operators) == {"emit", "forces", "move", "points"}
    assert [str(lk) for lk in p.links][0] == "emit.Particles -> forces.Particles"
    assert p.preview == {"points": "points.Points"} and p.operators["forces"].params["Gravity"] == [0.0, -0.5, 0.0]


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("[operators.a\ntype = 1\n", 1, "TOML syntax error"),
        ('colour = "red"\n', 1, "unknown key 'colour'"),
        ('[engine]\nprofiling = "Fast"\n', 2, "unknown profiling level"),
        ("[engine]\nspeed = 3\n", 2, "unknown engine setting 'speed'"),
        ("[operators.a]\nCount = 3\n", 1, "needs type"),
        ('\n[operators.a]\ntype = "core.Nope"\n', 3, "unknown block type 'core.Nope'"),
        ('[operators.a]\ntype = "core.Fill"\n\nGain = 2\n', 4, "has no parameter 'Gain'"),
        ('links = ["a.Out => b.In"]\n[operators.a]\ntype = "core.Fill"\n', 1, "bad link"),
        ('links = ["a.Out -> b.In"]\n[operators.a]\ntype = "core.Fill"\n', 1, "no operator 'b'"),
        (
            'links = ["a.Oops -> b.In"]\n[operators.a]\ntype = "core.Fill"\n[operators.b]\ntype = "core.Scale"\n',
            1,
            "has no output 'Oops' (it has: Out)",
        ),
        ('[operators.a]\ntype = "core.Fill"\n[preview]\npoints = "zz.Out"\n', 4, "naming an operator"),
    ],
)
def test_bad_patches_name_file_and_line(text, line, words):
    err = _err(text)
    assert err.file == "p.toml" and err.line == line and words in err.message, (err.line, str(err))
    assert str(err).startswith(f"p.toml:{line}:")


def test_apply_builds_then_applies_only_the_difference():
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG)
    first = parse_patch(BASE, registry=REG)
    counts = apply_patch(adapter, first)
    assert counts["created"] == 2 and counts["links"] == 1 and engine.profiling.value == "PerBlock"
    engine.update()
    fill = adapter.block("fill")
    # a changed value is only a parameter update: the same block objects stay
    second = parse_patch(BASE.replace("Factor = 2.0", "Factor = 3.5"), registry=REG)
    counts = apply_patch(adapter, second, first)
    assert counts == {"created": 0, "deleted": 0, "swapped": 0, "params": 1, "links": 0, "regions": 0, "bypass": 0}
    assert adapter.block("fill") is fill and adapter.block("scale").params["Factor"].value == 3.5
    # a new operator and link; a removed value goes back to its default
    third_text = (
        BASE.replace("Value = 0.5\n", "").replace(
            'links = ["fill.Out -> scale.In"]', 'links = ["fill.Out -> scale.In", "scale.Out -> more.In"]'
        )
        + '\n[operators.more]\ntype = "core.Scale"\n'
    )
    third = parse_patch(third_text, registry=REG)
    counts = apply_patch(adapter, third, second)
    assert counts["created"] == 1 and counts["links"] == 1 and counts["params"] >= 1
    assert fill.params["Value"].value == 0.0
    engine.update()
    assert len(engine.plan.block_order) == 3
    # removing an operator removes its links too
    counts = apply_patch(adapter, second, third)
    assert counts["deleted"] == 1 and "more" not in adapter.operators()
    assert [str(lk) for lk in adapter.links()] == ["fill.Out -> scale.In"]


def test_a_broken_edit_changes_nothing(tmp_path):
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG)
    path = tmp_path / "p.toml"
    path.write_text(BASE)
    good = load_patch(path, REG)
    apply_patch(adapter, good)
    path.write_text(BASE.replace("Count = 128", "Count = -4"))  # out of range: refused by the block
    bad = load_patch(path, REG)
    with pytest.raises(PatchFileError) as exc:
        apply_patch(adapter, bad, good)
    assert exc.value.line == 8 and exc.value.block == "fill" and exc.value.param == "Count"
    assert adapter.block("fill").params["Count"].value == 128
    with pytest.raises(PatchFileError, match="cannot read"):
        load_patch(tmp_path / "missing.toml", REG)


def test_kernel_files_resolve_next_to_the_patch(tmp_path):
    from cudapatch.host_plugin.hosts.standalone import StandaloneHost  # noqa: F401 - the host wires search paths

    (tmp_path / "wave.cu").write_text(
        'extern "C" __global__ void wave(const float* In, float* Out, float gain, unsigned int n) {}'
    )
    text = '[operators.w]\ntype = "core.KernelFile"\nPath = "wave.cu"\n'
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG, search_paths=[tmp_path])
    apply_patch(adapter, parse_patch(text, path=tmp_path / "p.toml", registry=REG))
    block = adapter.block("w")
    assert block.params["Path"].value == str(tmp_path / "wave.cu")
    assert [p.name for p in block.description.inputs] == ["In"] and block.description.param("gain") is not None
    missing = HostAdapter(PlanOnlyEngine(), REG, search_paths=[tmp_path / "elsewhere"])
    with pytest.raises(PatchFileError, match="wave.cu"):
        apply_patch(missing, parse_patch(text, path=tmp_path / "p.toml", registry=REG))
