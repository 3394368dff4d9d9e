"""Patch files whose kernels declare their own names: a ``CustomKernel``'s ``Code`` or a ``KernelFile``'s
``Path`` makes the ports and scalars, so parameters and links are checked against the block those texts
describe, not against the default instance (describing compiles nothing)."""

from __future__ import annotations

import pytest

from cudapatch.errors import PatchFileError
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
from cudapatch.kernels import cuda_source

from .plan_engine import PlanOnlyEngine

REG = PluginHost().registry

WILD_CODE = (
    'extern "C" __global__ void wild(const float* In, float* Out, float Arm, unsigned int n)\n'
    "{ unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) Out[i] = In[i] * Arm; }\n"
)

WILD = f'''\
links = ["fill.Out -> wild.In", "wild.Out -> scale.In"]

[operators.fill]
type = "core.Fill"
Count = 256
Value = 0.25

[operators.wild]
type = "core.CustomKernel"
Arm = 3.0
Code = """
{WILD_CODE}"""

[operators.scale]
type = "core.Scale"
'''


@pytest.fixture(autouse=True)
def _no_compiler(monkeypatch):
    """Checking and applying a patch only describes blocks: any compile here is a bug."""

    def refuse(*args, **kwargs):
        raise AssertionError("describing a CustomKernel must not compile it")

    monkeypatch.setattr(cuda_source, "nvrtc_compile", refuse)


def test_code_declares_the_parameters_and_ports_it_is_checked_against():
    patch = parse_patch(WILD, path="p.toml", registry=REG)
    assert patch.operators["wild"].params["Arm"] == 3.0
    assert [str(lk) for lk in patch.links] == ["fill.Out -> wild.In", "wild.Out -> scale.In"]


def test_names_the_code_does_not_declare_are_still_refused_with_the_codes_names():
    with pytest.raises(PatchFileError) as exc:
        parse_patch(WILD.replace("Arm = 3.0", "gain = 3.0"), path="p.toml", registry=REG)
    err = exc.value
    assert err.line == 10 and err.block == "wild" and err.param == "gain"
    assert "has no parameter 'gain' (it has: Code, Arm)" in err.message
    with pytest.raises(PatchFileError) as exc:
        parse_patch(WILD.replace("fill.Out -> wild.In", "fill.Out -> wild.in"), path="p.toml", registry=REG)
    assert exc.value.line == 1 and "has no input 'in' (it has: In)" in exc.value.message


def test_a_patch_without_code_is_checked_against_the_default_kernel():
    text = '[operators.c]\ntype = "core.CustomKernel"\nArm = 1.0\n'
    with pytest.raises(PatchFileError, match=r"has no parameter 'Arm' \(it has: Code, gain\)"):
        parse_patch(text, path="p.toml", registry=REG)


def test_code_that_does_not_describe_is_left_to_the_adapter():
    """A signature the block cannot read is not a patch-file error: the block reports it, with the
    kernel's own location, when the adapter creates it."""
    text = WILD.replace("const float* In", "const floot* In").replace(
        'links = ["fill.Out -> wild.In", "wild.Out -> scale.In"]', ""
    )
    patch = parse_patch(text, path="p.toml", registry=REG)
    with pytest.raises(PatchFileError) as exc:
        apply_patch(HostAdapter(PlanOnlyEngine(), REG), patch)
    assert exc.value.block == "wild"


def test_applying_and_editing_a_patch_that_declares_its_own_names():
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG)
    first = parse_patch(WILD, path="p.toml", registry=REG)
    counts = apply_patch(adapter, first)
    assert counts["created"] == 3 and counts["links"] == 2
    engine.update()
    wild = adapter.block("wild")
    assert wild.params["Arm"].value == 3.0 and not engine.errors and len(engine.plan.block_order) == 3
    # An edit that renames the scalar in the code and sets it in the same save: the Code goes first,
    # so the new name exists when its value is set (the key comes before Code in the file).
    second_text = WILD.replace("Arm", "Reach").replace("Reach = 3.0", "Reach = 5.0")
    second = parse_patch(second_text, path="p.toml", registry=REG)
    apply_patch(adapter, second, first)
    wild = adapter.block("wild")
    assert "Arm" not in wild.params and wild.params["Reach"].value == 5.0
    engine.update()
    assert not engine.errors and len(engine.plan.block_order) == 3


def test_swapping_an_operator_to_a_custom_kernel_applies_its_code_first():
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG)
    before_text = WILD.split("[operators.wild]")[0] + '[operators.wild]\ntype = "core.Scale"\n'
    before_text += '\n[operators.scale]\ntype = "core.Scale"\n'
    before = parse_patch(before_text, path="p.toml", registry=REG)
    apply_patch(adapter, before)
    after = parse_patch(WILD, path="p.toml", registry=REG)
    counts = apply_patch(adapter, after, before)
    assert counts["swapped"] == 1
    assert adapter.block("wild").params["Arm"].value == 3.0
    assert {(lk.src, lk.dst) for lk in adapter.links()} == {("fill", "wild"), ("wild", "scale")}


def test_a_kernel_file_next_to_the_patch_declares_its_names(tmp_path):
    (tmp_path / "wild.cu").write_text(WILD_CODE)
    text = '[operators.w]\ntype = "core.KernelFile"\nPath = "wild.cu"\nArm = 2.0\nNope = 1\n'
    with pytest.raises(PatchFileError) as exc:
        parse_patch(text, path=tmp_path / "p.toml", registry=REG)
    assert exc.value.line == 5 and "has no parameter 'Nope' (it has: Path, Arm)" in exc.value.message
    patch = parse_patch(text.replace("Nope = 1\n", ""), path=tmp_path / "p.toml", registry=REG)
    adapter = HostAdapter(PlanOnlyEngine(), REG, search_paths=[tmp_path])
    apply_patch(adapter, patch)
    assert adapter.block("w").params["Arm"].value == 2.0
    linked = 'links = ["f.Out -> w.In", "f.Out -> w.in"]\n[operators.f]\ntype = "core.Fill"\n' + text
    with pytest.raises(PatchFileError, match=r"operator 'w' \(core.KernelFile\) has no input 'in' \(it has: In\)"):
        parse_patch(linked.replace("Nope = 1\n", ""), path=tmp_path / "p.toml", registry=REG)
    # A path the patch's directory does not hold may be found on the host's search paths: not checked here.
    assert parse_patch(text.replace("wild.cu", "elsewhere.cu"), path=tmp_path / "p.toml", registry=REG)
