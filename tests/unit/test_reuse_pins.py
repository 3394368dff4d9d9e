"""What keeps a value out of the shared buffers that buffer reuse hands around (no GPU): a probed wire
(``PinReason.PROBE``: its probe node reads it beside the graph's work) and an output a GL bridge or the
preview shows (the bridge's ``keep``: GL reads it after the frame), planned on the plan-only engine.
Unfused (``fuse=False``): fused, a chain of Scales is one kernel with no intermediate buffers to share.
On a GPU: tests/gpu/test_pins_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cudapatch import Fill, Scale
from cudapatch.blocks.block import Block
from cudapatch.engine.memory_plan import PinReason
from cudapatch.interop.bridge import GlBridge

from .plan_engine import PlanOnlyEngine
from .test_internal_blocks import StandInRing


class BridgedEngine(PlanOnlyEngine):
    """The plan-only engine with the frame hooks a GL bridge registers (no frame runs here)."""

    def add_frame_hook(self, hook: Any) -> None:
        pass

    def remove_frame_hook(self, hook: Any) -> None:
        pass


def _chain(engine: PlanOnlyEngine, n: int, count: int = 4096) -> list[Block]:
    """``Fill -> s0 -> ... -> s{n-1}``: every value but the last is read once, by the next block."""
    blocks: list[Block] = [engine.add(Fill(name="head", Count=count, Value=1.5))]
    for i in range(n):
        s = engine.add(Scale(name=f"s{i}", Factor=1.0 + i))
        engine.connect(blocks[-1], "Out", s, "In")
        blocks.append(s)
    return blocks


def _pin(engine: PlanOnlyEngine, block: Block, port: str = "Out") -> tuple[str | None, bool]:
    """``(why the value of block.port is pinned or None, whether its buffer is shared)`` in the plan."""
    mem = engine.plan.memory
    vi = mem.ports[(block.id, port)]
    return dict(mem.pinned).get(vi), mem.shared(mem.value_buffer[vi])


def test_a_probed_wire_keeps_a_buffer_of_its_own_and_shares_again_once_closed() -> None:
    engine = PlanOnlyEngine(fuse=False)
    blocks = _chain(engine, 10)
    mid = blocks[5]
    engine.update()
    assert engine.errors == () and _pin(engine, mid) == (None, True)  # shared: the next block reads it, then gone
    probe = engine.probe(mid, "Out")
    engine.update()
    assert _pin(engine, mid) == (PinReason.PROBE, False)
    assert engine.plan.memory.buffer_values()  # the rest of the chain still takes turns in shared buffers
    probe.close()
    engine.update()
    assert _pin(engine, mid) == (None, True)


def test_a_probe_on_an_input_pins_the_output_linked_into_it() -> None:
    engine = PlanOnlyEngine(fuse=False)
    blocks = _chain(engine, 8)
    engine.probe(blocks[4], "In")  # an input: the value s2.Out, which s3 reads
    engine.update()
    assert _pin(engine, blocks[3]) == (PinReason.PROBE, False)
    assert _pin(engine, blocks[4]) == (None, True)


def test_an_output_a_gl_bridge_shows_keeps_a_buffer_of_its_own() -> None:
    # A texture copied after each launch (not surface-writable: no writer block in the graph) and a
    # buffer ring written by a writer block: GL reads both after the frame, so no later value may
    # overwrite them, though nothing in the graph reads the first one after its reader has run.
    engine = BridgedEngine(fuse=False)
    blocks = _chain(engine, 10)
    shown, ringed = blocks[3], blocks[7]
    engine.update()
    assert _pin(engine, shown) == (None, True) and _pin(engine, ringed) == (None, True)
    bridge = GlBridge(engine, label="preview")
    texture = SimpleNamespace(texel_bytes=4, label="tex", format="r32f", surface_writable=False, handle=0x99)
    bridge.show_texture(shown, "Out", texture)
    bridge.show_buffer_ring(ringed, "Out", StandInRing())
    engine.update()
    assert engine.errors == ()
    assert _pin(engine, shown) == (PinReason.KEEP, False)
    assert _pin(engine, ringed) == (PinReason.KEEP, False)
    assert engine.plan.memory.buffer_values()  # the values nobody shows still share
