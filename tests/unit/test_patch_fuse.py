"""``fuse = false`` in a patch file's operator table: the per-block opt-out of ``Scale(fuse=False)``,
checked with its line, applied on load and on a reload (the same block, described again; a swapped-in
block, or one an undone edit swaps back, is built with it and described once), and kept by the node
editor's document."""

from __future__ import annotations

import pytest

from cudapatch.blocks.library.basic import Scale
from cudapatch.engine.compiler.fusion import FusedSource
from cudapatch.errors import CudapatchError, PatchFileError
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
from cudapatch.host_plugin.patch_writer import PatchDocument

from .plan_engine import PlanOnlyEngine

REG = PluginHost().registry

CHAIN = """\
links = ["f.Out -> a.In", "a.Out -> b.In", "b.Out -> c.In"]

[operators.f]
type = "core.Expression"
Code = "Index * 0.5"

[operators.a]
type = "core.Scale"
Factor = 2.0

[operators.b]
type = "core.Scale"
fuse = false
Factor = 3.0

[operators.c]
type = "core.Expression"
Code = "In + 1.0"
Inputs = "In"
"""


def _groups(engine: PlanOnlyEngine, adapter: HostAdapter) -> list[tuple[str, ...]]:
    names = {adapter.block(op).id: op for op in adapter.operators()}
    return [
        tuple(names[m] for m in n.source.members) for n in engine.plan.kernel_nodes if isinstance(n.source, FusedSource)
    ]


def test_an_operator_with_fuse_false_stays_out_of_fused_groups() -> None:
    patch = parse_patch(CHAIN, path="p.toml", registry=REG)
    assert patch.operators["b"].fuse is False and "fuse" not in patch.operators["b"].params
    assert patch.operators["a"].fuse is True
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG)
    apply_patch(adapter, patch)
    engine.update()
    assert engine.errors == () and adapter.block("b").fuse is False
    assert _groups(engine, adapter) == [("f", "a")]  # b runs alone, and c has nothing to fuse with
    unfused = parse_patch(CHAIN.replace("fuse = false\n", ""), path="p.toml", registry=REG)
    engine2 = PlanOnlyEngine()
    adapter2 = HostAdapter(engine2, REG)
    apply_patch(adapter2, unfused)
    engine2.update()
    assert _groups(engine2, adapter2) == [("f", "a", "b", "c")]


def test_a_reload_that_changes_fuse_describes_the_same_block_again() -> None:
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG)
    first = parse_patch(CHAIN, path="p.toml", registry=REG)
    apply_patch(adapter, first)
    b = adapter.block("b")
    second = parse_patch(
        CHAIN.replace("fuse = false\n", "").replace('Code = "In + 1.0"', 'Code = "In + 1.0"\nfuse = false'),
        path="p.toml",
        registry=REG,
    )
    counts = apply_patch(adapter, second, first)
    assert adapter.block("b") is b and b.fuse is True and adapter.block("c").fuse is False
    assert counts["params"] == 2 and counts["created"] == counts["swapped"] == 0
    engine.update()
    assert _groups(engine, adapter) == [("f", "a", "b")]


def _descriptions(monkeypatch: pytest.MonkeyPatch) -> list[Scale]:
    """The ``core.Scale`` blocks described from now on, once per description."""
    described: list[Scale] = []
    describe = Scale.describe

    def counting(self: Scale, b: object) -> None:
        described.append(self)
        describe(self, b)

    monkeypatch.setattr(Scale, "describe", counting)
    return described


def test_a_reload_that_swaps_in_an_operator_with_fuse_false_describes_its_block_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    adapter = HostAdapter(PlanOnlyEngine(), REG)
    first = parse_patch(CHAIN, path="p.toml", registry=REG)
    apply_patch(adapter, first)
    described = _descriptions(monkeypatch)
    expression = 'type = "core.Expression"\nCode = "In + 1.0"\nInputs = "In"\n'
    second = parse_patch(CHAIN.replace(expression, 'type = "core.Scale"\nfuse = false\n'), path="p.toml", registry=REG)
    counts = apply_patch(adapter, second, first)
    c = adapter.block("c")
    assert counts["swapped"] == 1 and isinstance(c, Scale) and c.fuse is False
    assert sum(b is c for b in described) == 1  # fuse=False to the constructor, not set on it afterwards


def test_an_undone_edit_swaps_back_an_operator_with_fuse_false_described_once(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = HostAdapter(PlanOnlyEngine(), REG)
    first = parse_patch(CHAIN, path="p.toml", registry=REG)
    apply_patch(adapter, first)
    b = adapter.block("b")
    expression = 'type = "core.Expression"\nCode = "In * 4.0"\nInputs = "In"'
    swapped = CHAIN.replace('type = "core.Scale"\nfuse = false\nFactor = 3.0', expression)
    second = parse_patch(swapped + '\n[operators.x]\ntype = "core.Scale"\n', path="p.toml", registry=REG)

    def refuse(*args: object, **kwargs: object) -> None:  # refused after the probe passed (a file changed ...)
        raise CudapatchError("refused", block="x")

    monkeypatch.setattr(adapter, "create", refuse)
    described = _descriptions(monkeypatch)
    with pytest.raises(PatchFileError, match="refused"):
        apply_patch(adapter, second, first)  # b is swapped to an Expression before x fails: the undo swaps it back
    back = adapter.block("b")
    assert back is not b and isinstance(back, Scale) and back.fuse is False and back.params["Factor"].value == 3.0
    assert sum(blk is back for blk in described) == 1


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ('type = "core.Fill"\nfuse = false\n', "(core.Fill) never fuses"),  # no elementwise kernel to opt out of
        ('type = "core.Scale"\nfuse = "no"\n', "fuse = 'no': write true or false"),
    ],
)
def test_a_bad_fuse_is_an_error_at_its_line(table: str, needle: str) -> None:
    text = f"# a patch\n\n[operators.x]\n{table}"
    with pytest.raises(PatchFileError) as info:
        parse_patch(text, path="p.toml", registry=REG)
    err = info.value
    assert needle in err.message and err.file == "p.toml" and err.line == 5 and err.block == "x"


def test_fuse_true_is_the_default_on_any_type() -> None:
    patch = parse_patch('[operators.x]\ntype = "core.Fill"\nfuse = true\n', path="p.toml", registry=REG)
    assert patch.operators["x"].fuse is True


def test_the_editor_document_keeps_and_writes_fuse_false() -> None:
    doc = PatchDocument(CHAIN)
    doc.set_param("b", "Factor", 4.0)  # an edit elsewhere in the table keeps the key
    doc.add_operator("d", "core.Scale", {"Factor": 0.5}, fuse=False)
    doc.add_operator("e", "core.Scale")
    patch = parse_patch(doc.text, path="p.toml", registry=REG)
    assert patch.operators["b"].fuse is False and patch.operators["b"].params == {"Factor": 4.0}
    assert patch.operators["d"].fuse is False and patch.operators["e"].fuse is True
    assert "fuse = false" in doc.operator("d").as_string() and "fuse" not in doc.operator("e")
    doc.set_param("d", "fuse", True)
    assert parse_patch(doc.text, path="p.toml", registry=REG).operators["d"].fuse is True


def test_an_operator_of_a_composite_file_may_say_fuse_false(tmp_path) -> None:
    (tmp_path / "pair.toml").write_text(
        'links = ["h.Out -> v.In"]\n\n[composite]\nname = "Pair"\n\n[operators.h]\ntype = "core.Scale"\n'
        'fuse = false\n\n[operators.v]\ntype = "core.Scale"\n\n[expose]\nIn = "h.In"\nOut = "v.Out"\n'
    )
    patch = parse_patch('[operators.p]\ntype = "core.Composite"\nPath = "pair.toml"\n', path=tmp_path / "p.toml")
    adapter = HostAdapter(PlanOnlyEngine(), REG, search_paths=[tmp_path])
    apply_patch(adapter, patch)
    pair = adapter.block("p")
    assert pair.inner("h").fuse is False and pair.inner("v").fuse is True
