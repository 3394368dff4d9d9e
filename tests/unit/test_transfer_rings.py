"""Upload and Download without a GPU: the blocks' descriptions and plans, and the rings' slot policy
(which slot the host may write, which complete slot it reads), run on host arrays laid out as the
pinned rings are."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Download, Scale, Upload
from cudapatch.blocks.library.transfer import DOWNLOAD_SLOTS, UPLOAD_SLOTS
from cudapatch.engine import Context, ExternalBinding, compile_plan
from cudapatch.engine.transfer import DownloadRing, UploadRing, upload_slot
from cudapatch.errors import BindingError
from cudapatch.kernels.types import DType


def test_upload_slot_never_hands_out_the_slot_a_frame_may_read() -> None:
    assert upload_slot(0, 0) == 1  # the first upload: sequence 1
    assert upload_slot(1, 1) == 2
    assert upload_slot(UPLOAD_SLOTS - 2, 0) == UPLOAD_SLOTS - 1  # the GPU behind, still room
    assert upload_slot(UPLOAD_SLOTS - 1, 0) is None  # would overwrite what a frame may still copy
    assert upload_slot(10, 8, slots=4) == 11 % 4
    assert upload_slot(10, 7, slots=4) is None  # slot 3 holds sequence 7, which a frame copies
    for latest in range(40):  # whatever the GPU copies (copying <= r <= latest) is never the slot written
        for copying in range(latest + 1):
            slot = upload_slot(latest, copying)
            if slot is not None:
                assert all(r % UPLOAD_SLOTS != slot for r in range(copying, latest + 1))


def _host_ring(cls, dtype: DType, count: int, slots: int, words: int):
    """A ring object over host arrays laid out as the pinned one (the GPU's side played by the test)."""
    ring = object.__new__(cls)
    ring.dtype, ring.count, ring.slots = dtype, count, slots
    ring._data = np.zeros((slots, count * dtype.lanes), dtype=dtype.base)
    ring._control = np.zeros(words, dtype=np.uint64)
    ring.block_name, ring.written, ring.dropped, ring.frame = "b", 0, 0, 0
    return ring


def test_upload_ring_writes_the_next_slot_and_publishes_after_the_data() -> None:
    ring = _host_ring(UploadRing, DType.FLOAT32, 4, UPLOAD_SLOTS, 2)
    a = np.arange(4, dtype=np.float32)
    assert ring.write(a) and ring._control[0] == 1 and (ring._data[1] == a).all()
    assert ring.write(a + 1) and ring.write(a + 2) and ring._control[0] == 3
    assert not ring.write(a + 3) and ring.dropped == 1  # the GPU reported nothing copied yet: slot 0 held 0
    ring._control[1] = 3  # a frame copies sequence 3
    assert ring.write(a + 3) and (ring._data[0] == a + 3).all() and ring.written == 4
    with pytest.raises(BindingError, match="the block takes 4 float"):
        ring.write(np.zeros(5, np.float32))
    with pytest.raises(BindingError):
        ring.write(np.zeros(4, np.float64))


def test_download_ring_reads_the_newest_complete_slot_once() -> None:
    ring = _host_ring(DownloadRing, DType.FLOAT2, 3, DOWNLOAD_SLOTS, 1 + DOWNLOAD_SLOTS)
    assert ring.read() is None
    for frame in (1, 2):  # as the kernel does: data, then the slot's frame word
        ring._data[frame % 3] = frame
        ring._control[1 + frame % 3] = frame
        ring._control[0] = frame
    values, frame = ring.read()
    assert frame == 2 and values.shape == (3, 2) and (values == 2).all()
    assert ring.read() is None  # nothing newer
    ring._control[1 + 3 % 3] = 0  # frame 3 is being written: not complete
    assert ring.read() is None
    ring._data[0], ring._control[1] = 3, 3
    assert ring.read()[1] == 3


def test_upload_and_download_plan_as_one_block_kernels_on_their_bound_rings() -> None:
    up, s, down = Upload(name="up", Count=64), Scale(name="s"), Download(name="down")
    c = Context()
    for b in (up, s, down):
        c.register_block(b)
    c.connect(up, "Out", s, "In")
    c.connect(s, "Out", down, "In")
    plan = compile_plan(c.snapshot())
    assert plan.block_order == ()  # Ring and Control unbound: left out, and so is what reads them
    assert {d.block_id for d in plan.diagnostics} == {up.id, s.id, down.id}
    for b, ring_count in ((up, UPLOAD_SLOTS * 64), (down, DOWNLOAD_SLOTS * 64)):
        c.bind_input(b, "Ring", ExternalBinding(0x7000_0000, ring_count, DType.FLOAT32))
        c.bind_input(b, "Control", ExternalBinding(0x7100_0000, 4, DType.UINT64))
    plan = compile_plan(c.snapshot())
    assert plan.block_order == (up.id, s.id, down.id)
    upload, scale, download = (n for n in plan.nodes)
    assert upload.entry_point == "upload_copy" and upload.grid == 1  # one block: one slot for the whole copy
    assert [a.value for a in upload.args[3:]] == [64, UPLOAD_SLOTS, UPLOAD_SLOTS * 64]
    assert download.entry_point == "download_copy" and download.grid == 1
    assert [a.value for a in download.args[3:]] == [64, DOWNLOAD_SLOTS * 64]  # In's count, the ring's
    assert upload.index in scale.deps and scale.index in download.deps
