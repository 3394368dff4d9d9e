"""Regions in patch files and the host adapter (no GPU): operators placed in If/While/For operators
with ``region = "name"``, checked with file and line, applied as placements, kept across edits,
renames, deletions and hot swaps; the Jacobi example's patch plans to a While with its body."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudapatch.engine.plan import ConditionalNodePlan
from cudapatch.errors import CudapatchError, PatchFileError
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, load_patch, parse_patch

from .plan_engine import PlanOnlyEngine

REG = PluginHost().registry
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "08_jacobi.toml"

FOR_PATCH = """\
links = ["Src.Out -> Step.In"]

[operators.Src]
type = "Fill"
Count = 64

[operators.Steps]
type = "For"
Count = 8

[operators.Step]
type = "Scale"
region = "Steps"
Factor = 0.5
"""


def _adapter() -> tuple[HostAdapter, PlanOnlyEngine]:
    eng = PlanOnlyEngine()
    return HostAdapter(eng, REG), eng


def test_the_jacobi_example_patch_plans_a_while_with_its_body() -> None:
    patch = load_patch(EXAMPLE, registry=REG)
    assert {n for n, s in patch.operators.items() if s.region == "Solve"} == {"SweepA", "SweepB", "Decide"}
    adapter, eng = _adapter()
    adapter.search_paths.append(EXAMPLE.parent)
    counts = apply_patch(adapter, patch)
    assert counts["regions"] == 3 and adapter.regions() == {"SweepA": "Solve", "SweepB": "Solve", "Decide": "Solve"}
    eng.update()
    assert eng.errors == ()
    plan = eng.plan
    conds = [n for n in plan.nodes if isinstance(n, ConditionalNodePlan)]
    solve = adapter.block("Solve")
    region = plan.regions[solve.id]
    assert region.unroll == 8  # the example's Unroll: a WHILE node for the passes of 8, one for the tail
    assert [c.index for c in conds] == [region.node, region.tail]
    for cond in conds:
        assert cond.block_id == solve.id and cond.kind == "while"
        body = {plan.nodes[i].block_id for i, p in plan.scopes.items() if p == cond.index}
        assert body == {adapter.block(n).id for n in ("SweepA", "SweepB", "Decide")} | {solve.id}
    assert region.limit == "Max"


def test_a_region_key_is_checked_with_its_line() -> None:
    bad_type = FOR_PATCH.replace('type = "For"', 'type = "Fill"')
    with pytest.raises(PatchFileError) as ei:
        parse_patch(bad_type, path="p.toml", registry=REG)
    assert "is not a region" in ei.value.message and ei.value.line == 13
    missing = FOR_PATCH.replace('region = "Steps"', 'region = "Nope"')
    with pytest.raises(PatchFileError) as ei:
        parse_patch(missing, path="p.toml", registry=REG)
    assert "'Nope' is not an operator" in ei.value.message and ei.value.line == 13
    not_text = FOR_PATCH.replace('region = "Steps"', "region = 3")
    with pytest.raises(PatchFileError) as ei:
        parse_patch(not_text, path="p.toml", registry=REG)
    assert ei.value.line == 13
    itself = FOR_PATCH.replace('type = "For"\nCount = 8', 'type = "For"\nCount = 8\nregion = "Steps"')
    with pytest.raises(PatchFileError, match="holds itself"):
        parse_patch(itself, path="p.toml", registry=REG)


def test_editing_the_region_key_moves_the_operator() -> None:
    adapter, eng = _adapter()
    first = parse_patch(FOR_PATCH, registry=REG)
    apply_patch(adapter, first)
    assert adapter.regions() == {"Step": "Steps"}
    second = parse_patch(FOR_PATCH.replace('region = "Steps"\n', ""), registry=REG)
    counts = apply_patch(adapter, second, first)
    assert counts["regions"] == 1 and adapter.regions() == {}
    assert eng.context.snapshot().parents == {}
    counts = apply_patch(adapter, first, second)
    assert adapter.regions() == {"Step": "Steps"}
    assert eng.context.snapshot().parents == {adapter.block("Step").id: adapter.block("Steps").id}


def test_the_adapter_keeps_placements_across_rename_hot_swap_and_delete() -> None:
    adapter, eng = _adapter()
    apply_patch(adapter, parse_patch(FOR_PATCH, registry=REG))
    adapter.rename("Steps", "Loop")
    assert adapter.regions() == {"Step": "Loop"}
    new = adapter.hot_swap("Step", "core.VectorAdd")  # the swapped block stays in the region
    assert eng.context.snapshot().parents[new.id] == adapter.block("Loop").id
    loop = adapter.hot_swap("Loop", "core.While")  # a swapped region keeps its operators
    assert eng.context.snapshot().parents[new.id] == loop.id
    adapter.delete("Loop")
    assert adapter.regions() == {} and eng.context.snapshot().parents == {}
    with pytest.raises(CudapatchError, match="not a region"):
        adapter.place("Step", "Src")


def test_a_while_without_max_in_a_patch_is_an_error_on_the_region() -> None:
    text = EXAMPLE.read_text().replace("Max = 20000", "")
    adapter, eng = _adapter()
    adapter.search_paths.append(EXAMPLE.parent)
    apply_patch(adapter, parse_patch(text, path=EXAMPLE, registry=REG))
    eng.update()
    solve = adapter.block("Solve")
    assert any(d.block_id == solve.id and d.code == "region-max" for d in eng.errors)


def test_a_while_with_max_0_in_a_patch_or_from_a_host_is_refused_and_the_old_value_stays() -> None:
    text = EXAMPLE.read_text()
    assert "Max = 20000" in text
    adapter, eng = _adapter()
    adapter.search_paths.append(EXAMPLE.parent)
    bad = parse_patch(text.replace("Max = 20000", "Max = 0"), path=EXAMPLE, registry=REG)
    with pytest.raises(PatchFileError) as ei:  # checked before anything is built
        apply_patch(adapter, bad)
    line = 1 + text[: text.index("Max = 20000")].count("\n")
    assert (ei.value.file, ei.value.line) == (str(EXAMPLE), line)
    assert (ei.value.block, ei.value.param) == ("Solve", "Max") and "out of range [1, " in str(ei.value)
    assert not adapter.operators()
    good = parse_patch(text, path=EXAMPLE, registry=REG)
    apply_patch(adapter, good)
    eng.update()
    assert eng.errors == ()
    eng.context.dirty.clear_structure()
    with pytest.raises(PatchFileError, match="Max"):  # a live edit to 0: refused, the running patch untouched
        apply_patch(adapter, bad, good)
    solve = adapter.block("Solve")
    assert solve.get("Max") == 20000 and not eng.context.dirty.any
    with pytest.raises(CudapatchError, match="out of range") as ei:  # a host's text for the value
        adapter.set_param("Solve", "Max", "0")
    assert (ei.value.block, ei.value.param) == ("Solve", "Max") and solve.get("Max") == 20000
    # A live edit that removes Max would set it back to its default 0: refused before anything changes.
    edited = text.replace("Max = 20000", "").replace('  "Zero.Out -> SweepA.u",\n', "")
    assert edited.count("->") == text.count("->") - 1
    removed = parse_patch(edited, path=EXAMPLE, registry=REG)
    links = adapter.links()
    with pytest.raises(PatchFileError, match="removed from the file, it would go back to its default 0") as ei:
        apply_patch(adapter, removed, good)
    assert (ei.value.block, ei.value.param, ei.value.line) == ("Solve", "Max", removed.operators["Solve"].line)
    assert solve.get("Max") == 20000 and adapter.links() == links and not eng.context.dirty.any


def test_a_loops_unroll_comes_from_its_patch_file() -> None:
    patch = parse_patch(FOR_PATCH.replace("Count = 8\n", "Count = 8\nUnroll = 2\n"), path="p.toml", registry=REG)
    adapter, eng = _adapter()
    apply_patch(adapter, patch)
    eng.update()
    assert eng.errors == ()
    plan = eng.plan
    steps = adapter.block("Steps")
    rp = plan.regions[steps.id]
    assert rp.unroll == 2 and rp.tail is not None
    assert len([n for n in plan.nodes if getattr(n, "block_id", None) == adapter.block("Step").id]) == 3
