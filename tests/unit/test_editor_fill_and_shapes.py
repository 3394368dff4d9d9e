"""What the editor's nodes and wires say about the data, read from a real plan and real stats rows
(no device): an append output's fill comes from the frame's ``EngineStats``, and an image wire's
tooltip gives the 2-D shape (height x width), element type and bytes the planner gave the buffer."""

from __future__ import annotations

from cudapatch.engine.profiling import AppendStats, BlockStats, EngineStats, ProfilingLevel

from .test_editor_model import _open

FILTER = """\
links = ["fill.Out -> keep.In"]

[operators.fill]
type = "core.Fill"
Count = 256

[operators.keep]
type = "core.AppendFilter"
Capacity = 128
"""

IMAGES = """\
links = ["cam.Out -> blur.In", "blur.Out -> small.In"]

[operators.cam]
type = "image.Pattern"
Width = 64
Height = 48

[operators.blur]
type = "image.Blur"

[operators.small]
type = "image.Resample"
Width = 32
Height = 16
"""


def _stats(adapter, append: dict[str, dict[str, AppendStats]]) -> EngineStats:
    """A frame's stats, as ``engine.stats()`` reports them: every operator OK, ``append`` by operator."""
    rows = tuple(
        BlockStats(adapter.block(op).id, op, "OK", "", None, append=append.get(op, {})) for op in adapter.operators()
    )
    return EngineStats(ProfilingLevel.NONE, 3, 1, None, rows, 0, 0, 0)


def test_an_append_output_gets_its_fill_from_the_frames_stats(tmp_path):
    _, adapter, _, model = _open(tmp_path, FILTER)
    adapter.engine.update()
    nodes = model.nodes()
    (kept,) = nodes["keep"].outputs
    assert kept.name == "Kept" and kept.type == "append float[]"
    assert nodes["keep"].append == {}  # no frame has reported yet: no bar
    model.refresh(_stats(adapter, {"keep": {"Kept": AppendStats(40, 128, False)}}))
    assert model.nodes()["keep"].append == {"Kept": (40, 128)}
    assert model.nodes()["fill"].append == {}  # a plain output has no fill
    # Each frame's row replaces the last: a full buffer reads full, a row without fills clears the bar.
    model.refresh(_stats(adapter, {"keep": {"Kept": AppendStats(128, 128, True)}}))
    assert model.nodes()["keep"].append == {"Kept": (128, 128)}
    model.refresh(_stats(adapter, {}))
    assert model.nodes()["keep"].append == {}


def test_image_wires_show_the_planned_shape_type_and_bytes(tmp_path):
    _, adapter, _, model = _open(tmp_path, IMAGES)
    adapter.engine.update()
    assert not adapter.engine.errors
    model.version += 1  # the plan exists now: wire sizes come from it
    links = {str(lk): lk for lk in model.links()}
    cam = links["cam.Out -> blur.In"]
    # Pattern's Height x Width, in the order the planner holds 2-D shapes (rows first).
    assert (cam.type, cam.shape, cam.count, cam.nbytes) == ("uchar4[]", "48x64", 48 * 64, 48 * 64 * 4)
    assert cam.size_text == "uchar4[] 48x64  3,072 elements, 12,288 bytes"
    # Blur's output is shaped like its input; the wire carries that shape on to Resample.
    assert links["blur.Out -> small.In"].size_text == "uchar4[] 48x64  3,072 elements, 12,288 bytes"
    assert model.port_text("cam", "Out", "out").startswith("cam.Out\nuchar4[] 48x64  3,072 elements, 12,288 bytes")
    assert model.port_text("blur", "In", "in").startswith("blur.In\nuchar4[] 48x64  3,072 elements, 12,288 bytes")
    # An unlinked output still shows what the plan made of it: Resample's own Height x Width.
    assert model.port_text("small", "Out", "out").startswith("small.Out\nuchar4[] 16x32  512 elements, 2,048 bytes")


def test_a_shape_edit_is_shown_on_the_wire_once_planned_again(tmp_path):
    _, adapter, _, model = _open(tmp_path, IMAGES)
    adapter.engine.update()
    assert model.set_param("cam", "Width", 100)
    adapter.engine.update()
    model.version += 1
    links = {str(lk): lk for lk in model.links()}
    assert links["cam.Out -> blur.In"].size_text == "uchar4[] 48x100  4,800 elements, 19,200 bytes"
    assert "Width = 100" in model.doc.text
