"""``[editor] bypassed`` in a patch file: applied by ``apply_patch`` wherever the file is (the first load,
every live reload), through ``HostAdapter.set_bypass``; names that are no operator are warnings."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from cudapatch.errors import PatchFileError
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, load_patch, parse_patch
from cudapatch.host_plugin.hosts.live_reload import PatchReloader

from .plan_engine import PlanOnlyEngine

REG = PluginHost().registry

BASE = """\
links = ["fill.Out -> scale.In", "scale.Out -> more.In"]

[operators.fill]
type = "core.Fill"
Count = 128

[operators.scale]
type = "core.Scale"
Factor = 2.0

[operators.more]
type = "core.Scale"

[editor]
bypassed = {names}

[editor.positions]
fill = [40.0, 40.0]
"""


def _text(*names: str, base: str = BASE) -> str:
    return base.replace("{names}", "[" + ", ".join(f'"{n}"' for n in names) + "]")


class _Calls(HostAdapter):
    """Records each ``set_bypass`` call, so a test sees that a flag already right is not set again."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls: list[tuple[str, bool]] = []

    def set_bypass(self, op_id, on):
        self.calls.append((op_id, on))
        super().set_bypass(op_id, on)

    def flags(self) -> set[str]:
        return {op for op in self.operators() if self.bypassed(op)}


def _reloader(tmp_path: Path, text: str) -> tuple[PatchReloader, Path, _Calls, PlanOnlyEngine]:
    """``text`` saved and loaded as the standalone host loads it, with a reloader applying its edits."""
    path = tmp_path / "p.toml"
    path.write_text(text)
    patch = load_patch(path, REG)
    engine = PlanOnlyEngine()
    adapter = _Calls(engine, REG)
    apply_patch(adapter, patch)
    reloader = PatchReloader(
        path, patch, load=lambda p: load_patch(p, REG), apply=lambda n, o: apply_patch(adapter, n, o)
    )
    return reloader, path, adapter, engine


def _save(path: Path, text: str, stamp: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(stamp, stamp))  # distinct mtimes even on a coarse file system clock


def test_the_first_load_applies_the_bypassed_operators() -> None:
    patch = parse_patch(_text("scale"), path="p.toml", registry=REG)
    assert patch.bypassed == ("scale",)
    engine = PlanOnlyEngine()
    adapter = _Calls(engine, REG)
    counts = apply_patch(adapter, patch)
    assert counts["bypass"] == 1 and adapter.flags() == {"scale"} and adapter.calls == [("scale", True)]
    assert engine.context.bypassed == {adapter.block("scale").id}  # the engine's Bypass tier has it
    engine.update()
    assert engine.plan is not None and not engine.errors


def test_a_file_without_bypassed_operators_sets_no_flag() -> None:
    adapter = _Calls(PlanOnlyEngine(), REG)
    counts = apply_patch(adapter, parse_patch(_text(), registry=REG))
    assert counts["bypass"] == 0 and adapter.calls == [] and adapter.flags() == set()
    text = BASE.replace("[editor]\nbypassed = {names}\n\n", "")  # positions only: loads as before
    assert parse_patch(text, registry=REG).bypassed == ()


def test_a_reload_bypasses_what_joins_the_list_and_runs_what_leaves_it(tmp_path: Path) -> None:
    reloader, path, adapter, engine = _reloader(tmp_path, _text("scale"))
    assert adapter.flags() == {"scale"}
    _save(path, _text("fill", "more"), 1_000_000_000)
    assert reloader.poll(force=True) and "3 bypass" in reloader.status
    assert adapter.flags() == {"fill", "more"}
    assert engine.context.bypassed == {adapter.block("fill").id, adapter.block("more").id}
    assert sorted(adapter.calls[1:]) == [("fill", True), ("more", True), ("scale", False)]
    # an edit that leaves the list alone sets no flag (the ones already right are not set again)
    calls = len(adapter.calls)
    _save(path, _text("fill", "more").replace("Factor = 2.0", "Factor = 3.0"), 2_000_000_000)
    assert reloader.poll(force=True) and adapter.block("scale").params["Factor"].value == 3.0
    assert len(adapter.calls) == calls and adapter.flags() == {"fill", "more"}
    _save(path, _text(), 3_000_000_000)
    assert reloader.poll(force=True) and adapter.flags() == set() and engine.context.bypassed == set()


def test_an_operator_made_again_under_a_listed_name_is_bypassed_again(tmp_path: Path) -> None:
    reloader, path, adapter, _ = _reloader(tmp_path, _text("more"))
    first = adapter.block("more")
    gone = _text("more").replace(', "scale.Out -> more.In"', "").replace('[operators.more]\ntype = "core.Scale"\n', "")
    _save(path, gone, 1_000_000_000)  # deleted from the file, left in the list (a warning)
    assert reloader.poll(force=True) and "more" not in adapter.operators()
    _save(path, _text("more"), 2_000_000_000)  # back: a new block, still listed in both versions
    assert reloader.poll(force=True) and adapter.block("more") is not first
    assert adapter.flags() == {"more"} and not adapter.block("more").enabled


def test_unknown_names_in_the_list_are_warnings_with_the_file_and_name(tmp_path: Path, caplog) -> None:
    text = _text("scale", "nope")
    lines = text.splitlines()
    line = next(i + 1 for i, s in enumerate(lines) if s.startswith("bypassed"))
    with caplog.at_level(logging.WARNING, logger="cudapatch.host"):
        reloader, path, adapter, _ = _reloader(tmp_path, text)
    assert adapter.flags() == {"scale"}  # the rest of the list applies
    (record,) = [r for r in caplog.records if "nope" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert f"{path}:{line}:" in record.getMessage() and "no operator 'nope'" in record.getMessage()
    assert reloader.errors == []


@pytest.mark.parametrize(
    "editor, words",
    [
        ('bypassed = "scale"', "write a list of operator names"),
        ("bypassed = [1, 2]", "write a list of operator names"),
    ],
)
def test_a_bypassed_list_of_the_wrong_type_is_an_error_at_its_line(editor: str, words: str) -> None:
    text = BASE.replace("bypassed = {names}", editor)
    line = next(i + 1 for i, s in enumerate(text.splitlines()) if s.startswith("bypassed"))
    with pytest.raises(PatchFileError) as exc:
        parse_patch(text, path="p.toml", registry=REG)
    assert exc.value.file == "p.toml" and exc.value.line == line and words in exc.value.message


def test_an_editor_key_that_is_not_a_table_is_an_error() -> None:
    with pytest.raises(PatchFileError, match="'editor' must be a table"):
        parse_patch('editor = 3\n[operators.a]\ntype = "core.Fill"\n', path="p.toml", registry=REG)
