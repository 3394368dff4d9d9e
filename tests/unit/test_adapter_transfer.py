"""Upload and Download operators through the host adapter, without a GPU: a patch file's Upload gets its
ring when the adapter creates it, so the chain after it plans; ``upload``/``download`` by operator id
write and read the rings' pinned memory (the recording driver's host memory, at the addresses the
blocks are bound to); the refusals name the operator. The GPU round trip is in
tests/gpu/test_host_transfer_gpu.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import cudapatch.kernels._driver as driver_module
from cudapatch.blocks.library.transfer import DOWNLOAD_SLOTS, UPLOAD_SLOTS
from cudapatch.engine.bindings import binding_from_cai
from cudapatch.errors import BindingError, CudapatchError, PatchFileError
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
from cudapatch.host_plugin.hosts.touchdesigner import BlockOperatorExt, TouchDesignerHost
from cudapatch.kernels.types import DType

from ..td_double import COMP
from .plan_engine import PlanOnlyEngine
from .recording_driver import RecordingDriver
from .test_patch_apply_undo import _ReadOnce

REG = PluginHost().registry

PATCH = """\
links = ["mic.Out -> gain.In", "gain.Out -> tap.In"]

[operators.mic]
type = "core.Upload"
Count = 8

[operators.gain]
type = "core.Scale"
Factor = 2.0

[operators.tap]
type = "core.Download"
Count = 8
"""


class BindingEngine(PlanOnlyEngine):
    """The plan-only engine plus ``bind`` of device-visible arrays, through the engine's own CAI path
    (what the rings bind: their mapped memory)."""

    def bind(self, block, port, array) -> None:
        binding = binding_from_cai(array, block.description.input(port).dtype, block.name, port)
        self.context.bind_input(block, port, binding)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(19)


@pytest.fixture
def rec(monkeypatch) -> RecordingDriver:
    fake = RecordingDriver()  # cuMemHostAlloc gives host memory whose device address is its own
    monkeypatch.setattr(driver_module, "_driver", fake)
    return fake


@pytest.fixture
def adapter(rec) -> HostAdapter:
    a = HostAdapter(BindingEngine(), REG)
    apply_patch(a, parse_patch(PATCH, path="mic.toml", registry=REG))
    yield a
    a.close_rings()


def _bound(adapter: HostAdapter, op: str, port: str):
    block = adapter.block(op)
    return adapter.engine.context.snapshot().bindings[(block.id, port)]


def _memory(binding, ctype, count: int) -> np.ndarray:
    """The bound memory as the kernel sees it (the recording driver's device address is the host one)."""
    return np.ctypeslib.as_array((ctype * count).from_address(binding.ptr))


def test_a_patch_files_upload_plans_with_its_chain_from_the_first_frame(adapter: HostAdapter) -> None:
    adapter.engine_operator.cook()
    engine = adapter.engine
    assert engine.errors == ()
    assert not [d for d in engine.plan.diagnostics if "not linked" in d.message]
    mic, gain, tap = (adapter.block(op) for op in ("mic", "gain", "tap"))
    assert engine.plan.block_order == (mic.id, gain.id, tap.id)
    ring = _bound(adapter, "mic", "Ring")
    assert ring.count == UPLOAD_SLOTS * 8 and ring.dtype is DType.FLOAT32
    assert _bound(adapter, "mic", "Control").count == 2
    assert _bound(adapter, "tap", "Ring").count == DOWNLOAD_SLOTS * 8
    assert _bound(adapter, "tap", "Control").count == 1 + DOWNLOAD_SLOTS


def test_upload_writes_the_next_slot_and_publishes_it(adapter: HostAdapter, rng: np.random.Generator) -> None:
    ring = _memory(_bound(adapter, "mic", "Ring"), ctypes.c_float, UPLOAD_SLOTS * 8).reshape(UPLOAD_SLOTS, 8)
    control = _memory(_bound(adapter, "mic", "Control"), ctypes.c_uint64, 2)
    assert control[0] == 0  # nothing written: the frame leaves Out as it is
    first, second = (rng.standard_normal(8).astype(np.float32) for _ in range(2))
    assert adapter.upload("mic", first) and control[0] == 1
    np.testing.assert_array_equal(ring[1], first)
    assert adapter.upload("mic", second) and control[0] == 2
    np.testing.assert_array_equal(ring[2], second)
    assert adapter.upload("mic", first)
    assert not adapter.upload("mic", second)  # no frame copied anything yet: the slot it needs may be read


def test_download_gives_none_then_the_newest_completed_values(adapter: HostAdapter, rng: np.random.Generator) -> None:
    ring = _memory(_bound(adapter, "tap", "Ring"), ctypes.c_float, DOWNLOAD_SLOTS * 8).reshape(DOWNLOAD_SLOTS, 8)
    control = _memory(_bound(adapter, "tap", "Control"), ctypes.c_uint64, 1 + DOWNLOAD_SLOTS)
    assert adapter.download("tap") is None
    frames = {f: rng.standard_normal(8).astype(np.float32) for f in (1, 2)}
    for f, values in frames.items():  # as the kernel writes a frame: data, then the slot's frame word
        ring[f % DOWNLOAD_SLOTS] = values
        control[1 + f % DOWNLOAD_SLOTS] = f
        control[0] = f
    np.testing.assert_array_equal(adapter.download("tap"), frames[2])
    np.testing.assert_array_equal(adapter.download("tap"), frames[2])  # nothing newer: the same values


def test_refusals_name_the_operator(adapter: HostAdapter) -> None:
    with pytest.raises(CudapatchError, match="unknown operator 'nope'"):
        adapter.upload("nope", np.zeros(8, np.float32))
    with pytest.raises(CudapatchError, match=r"operator 'gain' \(Scale\) is not a core.Upload") as info:
        adapter.upload("gain", np.zeros(8, np.float32))
    assert info.value.block == "gain"
    with pytest.raises(CudapatchError, match=r"operator 'mic' \(Upload\) is not a core.Download"):
        adapter.download("mic")
    with pytest.raises(BindingError, match="upload of 9 float32 values; the block takes 8 float") as info:
        adapter.upload("mic", np.zeros(9, np.float32))
    assert info.value.block == "mic"
    with pytest.raises(BindingError, match="float64") as info:
        adapter.upload("mic", np.zeros(8, np.float64))
    assert info.value.block == "mic"


def test_a_new_count_or_type_gets_a_new_ring_and_renames_follow(adapter: HostAdapter) -> None:
    adapter.set_param("mic", "Count", 16)
    assert adapter.upload("mic", np.ones(16, np.float32))
    assert _bound(adapter, "mic", "Ring").count == UPLOAD_SLOTS * 16
    adapter.set_param("mic", "Type", "float2")
    assert adapter.upload("mic", np.ones((16, 2), np.float32))
    assert _bound(adapter, "mic", "Ring").dtype is DType.FLOAT2
    adapter.rename("mic", "line_in")
    with pytest.raises(BindingError) as info:
        adapter.upload("line_in", np.ones(3, np.float32))
    assert info.value.block == "line_in"
    adapter.set_param("line_in", "Type", "float")  # what gain takes again
    assert adapter.upload("line_in", np.ones(16, np.float32))
    adapter.engine_operator.cook()
    assert adapter.engine.errors == ()
    assert adapter.block("line_in").id in adapter.engine.plan.block_order


def test_a_hot_swap_to_an_upload_gets_a_ring_and_away_from_one_drops_it(adapter: HostAdapter) -> None:
    adapter.hot_swap("gain", "core.Upload")
    assert _bound(adapter, "gain", "Ring").count == UPLOAD_SLOTS * 1024
    adapter.hot_swap("mic", "core.Scale")
    with pytest.raises(CudapatchError, match="not a core.Upload"):
        adapter.upload("mic", np.zeros(8, np.float32))
    adapter.delete("tap")
    with pytest.raises(CudapatchError, match="unknown operator 'tap'"):
        adapter.download("tap")


def test_an_engine_that_binds_nothing_creates_the_operators_and_refuses_their_data(rec) -> None:
    adapter = HostAdapter(PlanOnlyEngine(), REG)
    apply_patch(adapter, parse_patch(PATCH, path="mic.toml", registry=REG))
    with pytest.raises(CudapatchError, match="binds no rings"):
        adapter.upload("mic", np.zeros(8, np.float32))


def test_touchdesigner_block_comps_feed_and_read_their_rings(rec, rng: np.random.Generator) -> None:
    td = TouchDesignerHost(engine=BindingEngine(), plugins=PluginHost())
    mic = BlockOperatorExt(COMP("/p/mic"), td, "core.Upload")
    tap = BlockOperatorExt(COMP("/p/tap"), td, "core.Download")
    td.adapter.set_param("/p/mic", "Count", 4)
    samples = rng.standard_normal((2, 2)).astype(np.float32)  # a CHOP's numpyArray(): channels x samples
    assert mic.Upload(samples)
    ring = _memory(_bound(td.adapter, "/p/mic", "Ring"), ctypes.c_float, UPLOAD_SLOTS * 4).reshape(UPLOAD_SLOTS, 4)
    np.testing.assert_array_equal(ring[1], samples.reshape(-1))
    assert tap.Download() is None
    assert not mic.Upload(np.zeros(3, np.float32)) and "the block takes 4 float" in mic.ownerComp.errors[-1]
    assert tap.Upload(samples) is False and "not a core.Upload" in tap.ownerComp.errors[-1]
    td.adapter.close_rings()


class FreeRecordingDriver(RecordingDriver):
    """Also records each pinned free (a ring's memory going back)."""

    def cuMemFreeHost(self, p):  # noqa: N802
        self._rec("free_host", p)
        return super().cuMemFreeHost(p)


class SwappingEngine(BindingEngine):
    """The binding engine with the real engine's view of its builds: ``building`` while a build is in
    flight, and ``graph``, the one that runs, replaced when a build takes a structure edit."""

    building = False

    def __init__(self) -> None:
        super().__init__()
        self.graph: object | None = None

    def build(self) -> None:
        """A build swapped in: it took the structure edits made so far."""
        self.update()
        self.context.dirty.clear_structure()
        self.graph = object()


def test_a_dropped_ring_is_freed_only_once_a_graph_built_after_the_drop_runs(monkeypatch) -> None:
    rec = FreeRecordingDriver()
    monkeypatch.setattr(driver_module, "_driver", rec)
    engine = SwappingEngine()
    adapter = HostAdapter(engine, REG)
    apply_patch(adapter, parse_patch(PATCH, path="mic.toml", registry=REG))
    engine.build()
    old = _bound(adapter, "mic", "Ring").ptr
    adapter.set_param("mic", "Count", 16)  # the ring is replaced at once: the build for 16 binds the new one
    assert _bound(adapter, "mic", "Ring").ptr != old and _bound(adapter, "mic", "Ring").count == UPLOAD_SLOTS * 16
    assert adapter.upload("mic", np.ones(16, np.float32))  # the edit waits for its build: the graph reads the old
    engine.building = True  # the build in flight; the last graph still launches with the old ring
    assert adapter.upload("mic", np.ones(16, np.float32))
    assert "free_host" not in rec.names()
    engine.building = False
    adapter.set_param("mic", "Type", "float")  # (the same type: no new ring) and a build swapped in
    engine.build()
    adapter.upload("mic", np.ones(16, np.float32))
    assert rec.calls[-1] == ("free_host", old)
    # A deleted operator's ring: read by the graph that runs until the build without it is swapped in.
    tap = _bound(adapter, "tap", "Ring").ptr
    adapter.delete("tap")
    adapter.upload("mic", np.ones(16, np.float32))
    assert ("free_host", tap) not in rec.calls
    engine.build()
    adapter.upload("mic", np.ones(16, np.float32))
    assert rec.calls[-1] == ("free_host", tap)
    adapter.close_rings()
    assert rec.names().count("free_host") == 3  # and the ring in use


def test_a_reload_or_an_undone_edit_that_changes_count_gives_a_ring_of_the_new_size(adapter: HostAdapter) -> None:
    # Count removed from the file: back to its default on the block directly, and the ring follows.
    base = parse_patch(PATCH, path="mic.toml", registry=REG)
    reloaded = parse_patch(PATCH.replace('type = "core.Upload"\nCount = 8\n', 'type = "core.Upload"\n'), registry=REG)
    apply_patch(adapter, reloaded, base)
    count = int(adapter.block("mic").get("Count"))
    assert count != 8 and _bound(adapter, "mic", "Ring").count == UPLOAD_SLOTS * count
    # An edit that sets Count 16 through the adapter, then fails part way: the undo puts 8 back on the
    # block directly, and the ring of 16 goes with it.
    apply_patch(adapter, base, reloaded)
    assert _bound(adapter, "mic", "Ring").count == UPLOAD_SLOTS * 8
    registry = PluginHost().registry
    registry.add(_ReadOnce, name="test.ReadOnce")
    adapter.registry = registry
    _ReadOnce.reads = 0
    failing = PATCH.replace("Count = 8\n\n[operators.gain]", "Count = 16\n\n[operators.gain]") + (
        '\n[operators.r]\ntype = "test.ReadOnce"\n'
    )
    with pytest.raises(PatchFileError, match="its source is gone"):
        apply_patch(adapter, parse_patch(failing, path="mic.toml", registry=registry), base)
    assert adapter.block("mic").get("Count") == 8 and _bound(adapter, "mic", "Ring").count == UPLOAD_SLOTS * 8
    adapter.engine_operator.cook()
    assert adapter.engine.errors == ()
