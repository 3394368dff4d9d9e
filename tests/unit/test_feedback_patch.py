"""Patch files and the host adapter with FrameDelay feedback: a loop through a delay loads and plans,
one without a delay is refused at the link with the file's line, Upload/Download are block types."""

from __future__ import annotations

import pytest

from cudapatch.errors import CudapatchError, LinkError
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch

from .plan_engine import PlanOnlyEngine

REG = PluginHost().registry

LOOP = """\
links = [
    "fill.Out -> add.A",
    "delay.Out -> add.B",
    "add.Sum -> decay.In",
    "decay.Out -> delay.In",  # closes the loop: through the delay
]

[operators.fill]
type = "core.Fill"
Count = 256
Value = 0.5

[operators.delay]
type = "core.FrameDelay"
Count = 256
Fill = 1.0

[operators.add]
type = "core.VectorAdd"

[operators.decay]
type = "core.Scale"
Factor = 0.9
"""


def test_a_patch_file_with_a_loop_through_a_frame_delay_loads_and_plans() -> None:
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG)
    apply_patch(adapter, parse_patch(LOOP, path="loop.toml", registry=REG))
    engine.update()
    assert engine.errors == ()
    (dp,) = engine.plan.delays
    assert dp.current is not None
    delay = adapter.block("delay")
    assert dp.block_id == delay.id and delay.get("Fill") == 1.0
    engine.context.dirty.clear_structure()
    adapter.set_param("delay", "Reset", 1)  # the host's reset pulse: a Hot edit
    assert not engine.context.dirty.structure and (delay.id, "Reset") in engine.context.dirty.params


def test_a_loop_without_a_delay_is_refused_at_its_link() -> None:
    text = LOOP.replace('"decay.Out -> delay.In",  # closes the loop: through the delay', '"decay.Out -> add.B",')
    text = text.replace('    "delay.Out -> add.B",\n', "")
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG)
    with pytest.raises((LinkError, CudapatchError), match="cycle") as info:
        apply_patch(adapter, parse_patch(text, path="loop.toml", registry=REG))
    assert info.value.file == "loop.toml" and info.value.line == 4  # the link that closes it
    assert info.value.message.endswith("(loop: decay -> add -> decay)") and adapter.operators() == {}


def test_upload_download_and_frame_delay_are_core_block_types() -> None:
    for name in ("core.FrameDelay", "core.Upload", "core.Download"):
        assert name in REG


def test_the_game_of_life_patch_file_loads_and_plans_its_loop() -> None:
    from pathlib import Path

    from cudapatch.host_plugin import load_patch

    path = Path(__file__).resolve().parents[2] / "examples" / "09_game_of_life.toml"
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG)
    apply_patch(adapter, load_patch(path, registry=REG))
    engine.update()
    assert engine.errors == ()
    (dp,) = engine.plan.delays
    life = adapter.block("life")
    assert dp.current == engine.plan.outputs[(life.id, "next")]
    assert engine.plan.buffers[dp.previous].count == 65536
    paint = adapter.block("paint")
    assert engine.plan.buffers[engine.plan.outputs[(paint.id, "rgba")]].count == 256 * 256
