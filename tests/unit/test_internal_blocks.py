"""The blocks a preview adds to copy outputs into GL are internal: stable readable names (no memory
addresses), ``Block.internal`` set, and the overlay's table lists them dimmed under their source.
The bridge runs here over a stand-in engine; the drawing is tested in tests/gl/test_gl_headless.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cudapatch import Scale, VectorAdd
from cudapatch.blocks.block import Block
from cudapatch.engine.profiling import BlockStats, EngineStats, ProfilingLevel
from cudapatch.engine.registry import BlockRegistry
from cudapatch.interop.bridge import GlBridge
from cudapatch.interop.gl_writers import GlBufferWriter, GlRingWriter, GlSurfaceWriter
from cudapatch.interop.overlay import block_rows, engine_line


class StandInEngine:
    """What GlBridge uses of an engine while wiring: blocks added (in the engine's own registry, which
    refuses a second block of a name), links, frame hooks."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.context = SimpleNamespace(registry=BlockRegistry())
        self.links: list[tuple[str, str, str, str]] = []
        self.hooks: list[Any] = []

    def add_frame_hook(self, hook: Any) -> None:
        self.hooks.append(hook)

    def remove_frame_hook(self, hook: Any) -> None:
        self.hooks.remove(hook)

    def add(self, block: Block) -> Block:
        self.context.registry.add(block)
        self.blocks.append(block)
        return block

    def remove(self, block: Block) -> None:
        self.context.registry.remove(block)
        self.blocks.remove(block)

    def connect(self, src: Block, src_port: str, dst: Block, dst_port: str) -> None:
        self.links.append((src.name, src_port, dst.name, dst_port))


class StandInRing:
    """An ImportedRing as the bridge sees it while wiring: ``attach`` only."""

    def __init__(self) -> None:
        self.attached: list[Block] = []

    def attach(self, writer: Block) -> None:
        self.attached.append(writer)


def stand_in_buffer(label: str) -> Any:
    return SimpleNamespace(label=label, nbytes=4096, handle=0x1234)


def test_writer_classes_are_internal_and_user_blocks_are_not() -> None:
    assert GlRingWriter.internal and GlBufferWriter.internal and GlSurfaceWriter.internal
    assert not Block.internal and not VectorAdd.internal and not Scale(name="s").internal


def test_a_preview_writer_is_named_after_its_output_and_marked_internal() -> None:
    engine = StandInEngine()
    source = VectorAdd(name="points")
    bridge = GlBridge(engine, label="preview")
    ring = StandInRing()
    bridge.show_buffer_ring(source, "Sum", ring)
    (writer,) = ring.attached
    assert writer.name == "points.Sum -> preview"  # no address: the same in every run and every log
    assert writer.internal and writer in engine.blocks
    assert engine.links == [("points", "Sum", "points.Sum -> preview", "In")]
    assert dict(bridge.internal_blocks) == {writer.id: source.id}
    bridge.close()
    assert not bridge.internal_blocks and writer not in engine.blocks


def test_names_are_stable_across_bridges_and_say_where_the_output_goes() -> None:
    source = VectorAdd(name="add")
    names = []
    for _ in range(2):  # e.g. the preview's bridge rebuilt when the points output changes size
        engine = StandInEngine()
        bridge = GlBridge(engine, label="preview")
        ring = StandInRing()
        bridge.show_buffer_ring(source, "Sum", ring)
        names.append(ring.attached[0].name)
        bridge.close()
    assert names == ["add.Sum -> preview"] * 2
    engine = StandInEngine()
    bridge = GlBridge(engine)  # a host's own bridge: the default label
    bridge.show_buffer(source, "Sum", stand_in_buffer("GL buffer 7"))
    (writer,) = [b for b in engine.blocks if b is not source]
    assert isinstance(writer, GlBufferWriter) and writer.name == "add.Sum -> GL" and writer.internal
    assert dict(bridge.internal_blocks) == {writer.id: source.id}


def test_the_same_output_shown_twice_under_one_label_gets_two_names() -> None:
    engine = StandInEngine()
    source = engine.add(VectorAdd(name="add"))
    bridge = GlBridge(engine, label="preview")
    ring = StandInRing()
    bridge.show_buffer_ring(source, "Sum", ring)
    bridge.show_buffer(source, "Sum", stand_in_buffer("GL buffer 7"))  # the same output, a second view
    other = GlBridge(engine, label="preview")  # a second bridge of the same label
    other.show_buffer(source, "Sum", stand_in_buffer("GL buffer 8"))
    names = [b.name for b in engine.blocks if b is not source]
    assert names == ["add.Sum -> preview", "add.Sum -> preview 2", "add.Sum -> preview 3"]
    assert all(engine.context.registry.by_name(name) is not None for name in names)
    assert engine.links == [("add", "Sum", name, "In") for name in names]
    bridge.close()  # its writers leave the engine: their names are free again
    again = GlBridge(engine, label="preview")
    again.show_buffer(source, "Sum", stand_in_buffer("GL buffer 9"))
    assert [b.name for b in engine.blocks if b is not source] == ["add.Sum -> preview 3", "add.Sum -> preview"]


def _stats(block_id: int, name: str) -> BlockStats:
    return BlockStats(block_id, name, "OK", "", 0.1)


def test_block_rows_put_internal_blocks_under_their_source() -> None:
    emit, points, other = _stats(1, "emit"), _stats(2, "points"), _stats(3, "other")
    writer, image_writer = _stats(7, "points.Points -> preview"), _stats(8, "emit.Image -> preview")
    blocks = (emit, points, writer, other, image_writer)
    assert block_rows(blocks, {}) == [(b, False) for b in blocks]
    assert block_rows(blocks, {7: 2, 8: 1}) == [
        (emit, False),
        (image_writer, True),
        (points, False),
        (writer, True),
        (other, False),
    ]
    # a writer listed before its source, and one whose source is not listed (removed this frame)
    orphan = _stats(9, "gone.Out -> preview")
    assert block_rows((writer, orphan, points), {7: 2, 9: 5}) == [(points, False), (writer, True), (orphan, True)]


def test_the_engine_line_counts_internal_blocks_apart() -> None:
    blocks = (_stats(1, "emit"), _stats(2, "points"), _stats(7, "points.Points -> preview"))
    stats = EngineStats(ProfilingLevel.PER_BLOCK, 10, 2, 0.61, blocks, 5, 12 << 20, 64 << 20)
    assert engine_line(stats, {}) == "3 blocks, 5 kernels   GPU 0.610 ms   Pool 12 MB / 64 MB"
    assert engine_line(stats, {7: 2}) == "2 blocks (+1 internal), 5 kernels   GPU 0.610 ms   Pool 12 MB / 64 MB"


def test_what_a_gl_bridge_shows_is_never_fused_away() -> None:
    # A texture copied after each launch (no surface stores) reads the output outside the graph, with
    # no link: only the bridge's keep stops fusion from computing it inside the next block's kernel.
    from cudapatch.engine import ExternalBinding
    from cudapatch.kernels.types import DType

    from .plan_engine import PlanOnlyEngine

    class Engine(PlanOnlyEngine):  # the plan-only engine, with the frame hooks a bridge registers
        def add_frame_hook(self, hook: Any) -> None:
            pass

    engine = Engine()
    a, b, c = (engine.add(Scale(name=n)) for n in "abc")
    engine.connect(a, "Out", b, "In")
    engine.connect(b, "Out", c, "In")
    engine.context.bind_input(a, "In", ExternalBinding(0x1000, 64 * 64, DType.FLOAT32))
    engine.update()
    assert (b.id, "Out") not in engine.plan.outputs  # a -> b -> c: one fused kernel
    texture = SimpleNamespace(texel_bytes=4, label="tex", format="r32f", surface_writable=False, handle=0x99)
    GlBridge(engine).show_texture(b, "Out", texture)
    engine.update()
    assert (b.id, "Out") in engine.plan.outputs  # kept: the group ends at b, c runs apart
    groups = [n.source.members for n in engine.plan.kernel_nodes if getattr(n.source, "members", ())]
    assert groups == [(a.id, b.id)]
