"""The isolated engine on the CPU: edit mirroring, the message protocol, the restart policy, and
the host-side ``IsolatedEngine`` driven against a fake child and a fake GPU side."""

from __future__ import annotations

import pickle
import time
import types
from typing import Any

import numpy as np
import pytest

from cudapatch import Composite, DType, Engine, Fill, Scale, VectorAdd
from cudapatch.blocks.block import BlockState
from cudapatch.engine import Context, ExternalBinding
from cudapatch.errors import CudapatchError, LinkError
from cudapatch.isolated import IsolatedEngine, RestartPolicy
from cudapatch.isolated.mirror import (
    AddBlock,
    Bind,
    ChildPatch,
    Connect,
    Disable,
    Disconnect,
    Redescribe,
    RemoveBlock,
    SetValues,
)
from cudapatch.isolated.policy import ChildEnd
from cudapatch.isolated.protocol import EXIT_FAULT, InputHandle, OutputHandle, StartConfig
from cudapatch.kernels._compiler_child import FrameReader, encode_frame


def _export(binding: ExternalBinding) -> InputHandle:
    if isinstance(binding.owner, np.ndarray):  # as the real host side: host arrays go by value
        return InputHandle(binding.count, binding.dtype, array=binding.owner)
    return InputHandle(binding.count, binding.dtype, handle=b"h" * 64, offset=binding.ptr)


class ContextEngine:
    """The editing API of an Engine over a plain Context: what ChildPatch drives in the child."""

    def __init__(self) -> None:
        self.context = Context()
        self.disabled: dict[int, str] = {}
        self.profiling = "None"
        self.bound: dict[tuple[int, str], object] = {}

    def add(self, b):
        return self.context.register_block(b)

    def remove(self, b):
        self.context.unregister_block(b)

    def connect(self, *a):
        self.context.connect(*a)

    def disconnect(self, *a):
        return self.context.disconnect(*a)

    def bind(self, b, port, array, *, dtype=None):
        self.bound[(b.id, port)] = array
        self.context.bind_input(b, port, ExternalBinding(1, array.count, dtype))

    def disable(self, b, reason):
        self.disabled[b.id] = reason

    def set_profiling(self, level):
        self.profiling = level

    def keep(self, b, port, keep=True):
        self.context.keep(b, port, keep)


def _same_patch(host: Context, child: ChildPatch) -> None:
    """The child's patch equals the host's, block for block (by host id) and link for link."""
    hs, cs = host.snapshot(), child.engine.context.snapshot()
    to_host = child.to_host
    assert {b.id: (b.name, b.description, b.values) for b in hs.blocks} == {
        to_host[b.id]: (b.name, b.description, b.values) for b in cs.blocks
    }
    mapped = {(to_host[lk.src], lk.src_port, to_host[lk.dst], lk.dst_port) for lk in cs.links}
    assert mapped == {(lk.src, lk.src_port, lk.dst, lk.dst_port) for lk in hs.links}


def test_mirror_round_trip_builds_the_same_patch_in_the_child():
    host = Context()
    f, s, add = Fill(name="f", Count=64, Value=3.0), Scale(name="s", Factor=2.0), VectorAdd(name="add")
    for b in (f, s, add):
        host.register_block(b)
    host.connect(f, "Out", s, "In")
    host.connect(s, "Out", add, "A")
    host.connect(f, "Out", add, "B")
    mirror, child = PatchMirror_(), ChildPatch(ContextEngine(), lambda h: h)
    edits = mirror.diff(host.snapshot())
    assert [type(e) for e in edits] == [AddBlock] * 3 + [Connect] * 3
    child.apply(pickle.loads(pickle.dumps(edits)))  # edits travel pickled
    _same_patch(host, child)
    assert mirror.diff(host.snapshot()) == []  # nothing changed: nothing to send


def PatchMirror_():
    from cudapatch.isolated.mirror import PatchMirror

    return PatchMirror(_export)


def test_mirror_sends_only_what_changed():
    host = Context()
    f, s, t = Fill(name="f", Count=64), Scale(name="s"), Scale(name="t")
    for b in (f, s, t):
        host.register_block(b)
    host.connect(f, "Out", s, "In")
    mirror, child = PatchMirror_(), ChildPatch(ContextEngine(), lambda h: h)
    child.apply(mirror.diff(host.snapshot()))
    f.set("Count", 128)  # structural: goes with a structure diff
    s.set("Factor", 4.0)
    host.disconnect(f, "Out", s, "In")
    host.connect(f, "Out", t, "In")
    host.unregister_block(s)
    edits = mirror.diff(host.snapshot())
    assert RemoveBlock(s.id) in edits
    assert SetValues(f.id, {"Count": 128}) in edits
    assert Connect(f.id, "Out", t.id, "In") in edits
    assert not any(isinstance(e, Disconnect) for e in edits)  # the removed block took its link along
    child.apply(edits)
    _same_patch(host, child)


def test_a_new_description_is_sent_as_one_redescribe():
    host = Context()
    s = Scale(name="s")
    host.register_block(s)
    mirror = PatchMirror_()
    mirror.diff(host.snapshot())
    other = VectorAdd(name="v")  # any other description stands for an edited one
    s.description = other.description
    edits = mirror.diff(host.snapshot())
    assert len(edits) == 1 and isinstance(edits[0], Redescribe) and edits[0].description is other.description


def test_bindings_are_exported_once_and_host_arrays_each_time():
    host = Context()
    s = Scale(name="s")
    host.register_block(s)
    dev = ExternalBinding(4096, 16, DType.FLOAT32, owner=object())
    host.bind_input(s, "In", dev)
    mirror = PatchMirror_()
    edits = mirror.diff(host.snapshot())
    binds = [e for e in edits if isinstance(e, Bind)]
    assert binds == [Bind(s.id, "In", InputHandle(16, DType.FLOAT32, handle=b"h" * 64, offset=4096))]
    assert not [e for e in mirror.diff(host.snapshot()) if isinstance(e, Bind)]
    arr = np.ones(16, np.float32)
    assert mirror.bind((s.id, "In"), ExternalBinding(0, 16, DType.FLOAT32, owner=arr)) is not None
    assert mirror.bind((s.id, "In"), ExternalBinding(0, 16, DType.FLOAT32, owner=arr)) is not None


def test_messages_survive_the_frames():
    msgs = [
        ("frame", 7, ((3, "Factor", 2.5),)),
        ("start", StartConfig(device=0, frame_word_fd=5)),
        ("outputs", {(1, "Out"): OutputHandle(b"x" * 64, 256, 10, DType.FLOAT32, 40)}, True),
    ]
    data = b"".join(encode_frame(m) for m in msgs)
    reader = FrameReader()
    got = reader.feed(data[:5]) + reader.feed(data[5:])
    assert [pickle.loads(p) for p in got] == msgs


def test_the_frame_message_stays_small():
    hot = tuple((i, "Factor", 1.5) for i in range(4))
    assert len(encode_frame(("frame", 123456, hot))) < 200


def test_restart_policy_gives_up_after_too_many_ends_in_the_window():
    now = [0.0]
    p = RestartPolicy(max_restarts=2, window_s=10.0, clock=lambda: now[0])
    assert p.child_ended(ChildEnd("exited with code 3", {5: "bad"}))
    assert p.disabled == {5: "bad"}
    now[0] = 1.0
    assert p.child_ended(ChildEnd("killed by SIGSEGV"))
    now[0] = 20.0  # the first two are out of the window
    assert p.child_ended(ChildEnd("exited with code 3"))
    now[0] = 21.0
    assert p.child_ended(ChildEnd("exited with code 3"))
    assert p.lost is None
    now[0] = 22.0
    assert not p.child_ended(ChildEnd("exited with code 3"))
    assert "3 times" in p.lost and "exited with code 3" in p.lost
    assert p.code_changed(5) and not p.code_changed(5)


# -- the host-side engine against fakes ---------------------------------------------------------------
class FakeChild:
    def __init__(self, cfg: StartConfig) -> None:
        self.cfg = cfg
        self.sent: list = []
        self.inbox: list = []
        self.eof = False
        self.closed = self.released = False
        self.exit = "exited with code 0"

    def send(self, message):
        assert not self.closed
        self.sent.append(pickle.loads(pickle.dumps(message)))  # what goes over the pipe must pickle

    def read(self):
        out, self.inbox = self.inbox, []
        return out

    def wait_readable(self, timeout):
        pass

    def stderr_text(self):
        return "Traceback: boom\n"

    def close(self, timeout=5.0):
        self.closed = True
        return self.exit

    def release(self):
        self.released = True

    def frames(self):
        return [m for m in self.sent if m[0] == "frame"]

    def edits(self):
        return [e for m in self.sent if m[0] == "edits" for e in m[1]]


class FakeHostSide:
    def __init__(self) -> None:
        self.stream = 0
        self.device = None
        self.calls: list = []
        self.released: list[int] = []

    def start_parts(self, start_frame):
        self.calls.append(("start", start_frame))
        return 9

    def begin_frame(self, n):
        self.calls.append(("begin", n))

    def sent_frame(self, n):
        self.calls.append(("wait", n))
        self.sent = n
        self.done = n if not self.lagging else self.done

    lagging = False
    done = sent = 0

    def finished(self):
        return self.done

    def let_start(self):
        return self.sent

    def release(self, n):
        self.released.append(n)
        self.done = n  # as the frame word: every wait up to n is satisfied

    def export(self, binding):
        return _export(binding)

    def import_output(self, h):
        self.calls.append(("import", h.offset))
        return ("mapped", h.offset)

    def drop_outputs(self, keep=None):
        self.calls.append(("drop",) if keep is None else ("drop", frozenset(keep)))

    def synchronize(self):
        # The real wait on the host's stream never ends while a frame it waits for is unfinished (a
        # faulted child's): the engine must wait for the child's frames, reading its pipe, first.
        assert self.done >= self.sent, f"the host's stream waits for frame {self.sent}, the child finished {self.done}"
        self.calls.append(("sync",))

    def close(self):
        self.calls.append(("close",))

    def abandon(self):
        self.calls.append(("abandon",))


def fake_isolated():
    """An isolated Engine over fakes: ``.children`` (each a ``FakeChild``) and ``.gpu`` (the ``FakeHostSide``).
    The ``iso`` fixture here and in test_isolated_regions.py."""
    children: list[FakeChild] = []
    gpu = FakeHostSide()

    def launch(cfg):
        children.append(FakeChild(cfg))
        return children[-1]

    e = Engine(isolated=True, host_side=gpu, launch=launch, policy=RestartPolicy(max_restarts=3))
    e.children, e.gpu = children, gpu
    yield e
    e.close()


iso = pytest.fixture(fake_isolated, name="iso")


def _patch(e):
    f = e.add(Fill(name="fill", Count=64, Value=2.0))
    s = e.add(Scale(name="bad", Factor=3.0))
    e.connect(f, "Out", s, "In")
    return f, s


def test_engine_isolated_returns_the_proxy_with_the_engine_api(iso):
    assert isinstance(iso, IsolatedEngine)
    for name in ("add", "remove", "connect", "disconnect", "bind", "update", "read", "output", "stats", "show_frame",
                 "diagnostics", "close", "wait_ready", "disable", "set_profiling", "synchronize"):  # fmt: skip
        assert callable(getattr(iso, name)) and callable(getattr(Engine, name))
    assert iso.children[0].cfg.frame_word_fd == 9


def test_update_sends_the_patch_once_then_small_frames(iso):
    f, s = _patch(iso)
    iso.update()
    child = iso.children[0]
    assert child.sent[0][0] == "edits" and child.sent[1] == ("frame", 1, ())
    assert [type(e) for e in child.sent[0][1]][:3] == [AddBlock, AddBlock, Connect]
    assert iso.gpu.calls[-2:] == [("begin", 1), ("wait", 1)]  # host word before the message, stream wait after
    s.set("Factor", 5.0)  # Hot: with the frame, no edit message
    iso.update()
    assert child.sent[2] == ("frame", 2, ((s.id, "Factor", 5.0),))
    iso.update()
    assert child.sent[3] == ("frame", 3, ())
    assert iso.counters.frames == 3


def test_validation_stays_on_the_host(iso):
    f, s = _patch(iso)
    with pytest.raises(LinkError):
        iso.connect(s, "Out", f, "Nope")
    with pytest.raises(CudapatchError, match="not running"):
        iso.output(s, "Out")


def test_outputs_map_once_and_are_dropped_when_the_child_rebuilds(iso):
    f, s = _patch(iso)
    iso.update()
    child = iso.children[0]
    child.inbox.append(("outputs", {(s.id, "Out"): OutputHandle(b"x" * 64, 128, 64, DType.FLOAT32, 256)}, True))
    iso.update()
    assert iso.output(s, "Out") == ("mapped", 128)
    assert iso.output(s, "Out") == ("mapped", 128)
    assert iso.gpu.calls.count(("import", 128)) == 1
    child.inbox.append(("outputs", {}, True))
    iso.update()
    assert ("sync",) in iso.gpu.calls and ("drop",) in iso.gpu.calls  # host reads end before the unmap
    with pytest.raises(CudapatchError):
        iso.output(s, "Out")


def test_an_output_asked_for_without_polling_leaves_the_pipe_to_the_next_update(iso):
    """A frame hook (the GL bridge) asks for outputs inside ``update()``: with ``poll=False`` what the
    child sent meanwhile (new outputs, a restart) waits for the next ``update()`` instead of being taken
    halfway through this one (taking new outputs synchronizes the host's stream)."""
    f, s = _patch(iso)
    iso.update()
    child = iso.children[0]
    child.inbox.append(("outputs", {(s.id, "Out"): OutputHandle(b"x" * 64, 128, 64, DType.FLOAT32, 256)}, True))
    with pytest.raises(CudapatchError, match="not running"):
        iso.output(s, "Out", keep=False, poll=False)
    assert child.inbox and ("import", 128) not in iso.gpu.calls  # the pipe was not read
    iso.update()
    assert iso.output(s, "Out", keep=False, poll=False) == ("mapped", 128)


def test_a_warm_patch_remaps_only_the_outputs_it_moved_or_resized(iso):
    """Outputs sent again after a Warm patch (``replaced`` False): the output whose buffer grew is mapped
    anew (its shape too), after the host's reads end, and only the allocation nothing uses any more is
    unmapped; the unchanged output keeps its mapping, so a view of it stays valid."""
    from dataclasses import replace

    from cudapatch.blocks.shape import Shape

    f, s = _patch(iso)
    iso.update()
    child = iso.children[0]
    fill = OutputHandle(b"a" * 64, 0, 64, DType.FLOAT32, 256)
    scaled = OutputHandle(b"b" * 64, 512, 64, DType.FLOAT32, 256)
    child.inbox.append(("outputs", {(f.id, "Out"): fill, (s.id, "Out"): scaled}, True))
    iso.update()
    assert iso.output(f, "Out") == ("mapped", 0) and iso.output(s, "Out") == ("mapped", 512)
    iso.gpu.calls.clear()
    same = {(f.id, "Out"): replace(fill, frame=7), (s.id, "Out"): replace(scaled, frame=7)}
    child.inbox.append(("outputs", same, False))  # nothing moved (another frame number only)
    iso.update()
    assert not [c for c in iso.gpu.calls if c[0] in ("sync", "drop", "import")]
    grown = OutputHandle(b"c" * 64, 64, 128, DType.FLOAT32, 512, Shape.of(8, 16))
    child.inbox.append(("outputs", {(f.id, "Out"): fill, (s.id, "Out"): grown}, False))
    iso.update()
    calls = iso.gpu.calls
    assert calls.index(("sync",)) < calls.index(("drop", frozenset({b"a" * 64, b"c" * 64})))
    assert ("drop",) not in calls  # the fill's allocation stays mapped
    assert iso.output(s, "Out") == ("mapped", 64) and iso.output_shape(s, "Out") == Shape.of(8, 16)
    assert iso.output(f, "Out") == ("mapped", 0) and ("import", 0) not in calls  # not mapped again
    calls.clear()
    child.inbox.append(("outputs", {(f.id, "Out"): fill}, True))  # a new graph: every mapping goes
    iso.update()
    assert ("sync",) in calls and ("drop",) in calls


def test_diagnostics_and_states_reach_the_host_blocks(iso):
    f, s = _patch(iso)
    iso.update()
    iso.children[0].inbox.append(
        (
            "diagnostics",
            (("warning", s.id, "input-unlinked", "bad: input 'In' is not linked"),),
            {s.id: ("Warning", "x")},
        )
    )
    iso.update()
    (d,) = iso.diagnostics(s)
    assert d.code == "input-unlinked" and d.block_id == s.id
    assert s.debug.state is BlockState.WARNING


def test_a_fault_ends_only_the_child_and_the_next_one_runs_without_the_block(iso):
    f, s = _patch(iso)
    for _ in range(3):
        iso.update()
    first = iso.children[0]
    why = "CUDA_ERROR_ILLEGAL_ADDRESS in block 'bad' (kernel scale): the block is disabled"
    first.exit = f"exited with code {EXIT_FAULT}"
    t = time.monotonic()
    times = {"surfaced": t - 0.3, "named": t - 0.2, "reset": t - 0.1, "sent": t}
    first.inbox.append(("fault", (("error", s.id, "gpu-fault", why),), {s.id: why}, times))
    iso.update()  # notices the report, lets its stream go, starts another child, sends it a frame
    # Not waited for: its exit (the driver's teardown of a faulted context) is reaped in the background.
    assert first.released and not first.closed and len(iso.children) == 2
    stamps = iso.fault_times
    assert list(stamps) == ["surfaced", "named", "reset", "sent", "received", "released", "restarted"]
    assert list(stamps.values()) == sorted(stamps.values())
    assert iso.gpu.released[-1] == 3  # frames up to the last sent are released on the host's stream
    second = iso.children[1]
    assert second.cfg.start_frame == 3
    assert Disable(s.id, why) in second.edits()
    assert any(isinstance(e, AddBlock) and e.id == f.id for e in second.edits())  # the whole patch again
    assert second.frames()[0][1] == 4  # frames count on
    assert s.debug.state is BlockState.ERROR and "'bad'" in s.debug.message
    assert any(d.code == "gpu-fault" and d.block_id == s.id for d in iso.diagnostics())
    assert iso.restarts == 1 and iso.counters.faults == 1 and iso.lost is None
    assert iso.last_restart_s is not None


def test_a_crash_without_report_restarts_as_it_was(iso):
    _patch(iso)
    iso.update()
    iso.children[0].eof = True
    iso.children[0].exit = "killed by SIGSEGV"
    iso.update()
    assert iso.children[0].closed and not iso.children[0].released  # reaped here: its exit says how it ended
    assert len(iso.children) == 2 and not any(isinstance(e, Disable) for e in iso.children[1].edits())
    assert iso.fault_times == {}
    assert any("killed by SIGSEGV" in d.message for d in iso.diagnostics())


def test_too_many_ends_lose_the_engine_and_update_goes_on(iso):
    _patch(iso)
    for _ in range(4):
        iso.update()
        iso.children[-1].eof = True
    iso.update()
    assert iso.lost is not None and len(iso.children) == 4
    iso.update()  # no child, no exception
    assert any(d.code == "gpu-lost" for d in iso.diagnostics())
    with pytest.raises(CudapatchError, match="lost"):
        iso.read(iso.blocks[0], "Out")


def test_new_code_gives_a_disabled_block_a_new_chance(iso):
    f, s = _patch(iso)
    iso.update()
    iso.disable(s, "faulted")
    assert Disable(s.id, "faulted") in iso.children[0].edits()
    s.description = VectorAdd(name="x").description  # an edited kernel
    iso.context.on_structure_changed(s)
    iso.update()
    assert iso.policy.disabled == {}


def test_requests_wait_for_their_reply(iso):
    f, s = _patch(iso)
    iso.update()
    child = iso.children[0]
    want = np.arange(4, dtype=np.float32)

    def wait_readable(timeout):
        rid = [m for m in child.sent if m[0] == "request"][-1][1]
        child.inbox.append(("reply", rid, True, want))

    child.wait_readable = wait_readable
    assert np.array_equal(iso.read(s, "Out"), want)
    assert [m for m in child.sent if m[0] == "request"][-1][2:] == ("read", (s.id, "Out"))

    def refuse(timeout):
        rid = [m for m in child.sent if m[0] == "request"][-1][1]
        child.inbox.append(("reply", rid, False, CudapatchError("nope")))

    child.wait_readable = refuse
    with pytest.raises(CudapatchError, match="nope"):
        iso.read(s, "Out")


def test_binding_a_host_array_sends_it_each_time(iso):
    f, s = _patch(iso)
    iso.disconnect(f, "Out", s, "In")
    iso.bind(s, "In", np.ones(64, np.float32))
    iso.update()
    iso.bind(s, "In", np.full(64, 2.0, np.float32))
    iso.update()
    binds = [e for e in iso.children[0].edits() if isinstance(e, Bind)]
    assert len(binds) == 2 and binds[1].input.array[0] == 2.0


def test_close_stops_the_child_and_releases(iso):
    _patch(iso)
    iso.update()
    child = iso.children[0]
    iso.close()
    iso.close()
    assert child.closed and child.sent[-1] == ("close",) and ("close",) in iso.gpu.calls
    assert iso.is_closed


def test_the_isolated_engine_follows_the_lifecycle_protocol(iso):
    from cudapatch._lifecycle import HandleOwner, Lifecycle

    assert isinstance(iso, Lifecycle) and isinstance(iso, HandleOwner) and "closed=False" in repr(iso)
    gpu, children = FakeHostSide(), []
    with Engine(isolated=True, host_side=gpu, launch=lambda cfg: children.append(FakeChild(cfg)) or children[-1]) as e:
        e.update()
    assert e.is_closed and children[0].closed and ("close",) in gpu.calls and "closed=True" in repr(e)
    e.close()  # idempotent: nothing more happens
    assert gpu.calls.count(("close",)) == 1


def test_an_unclosed_isolated_engine_ends_its_process_and_warns():
    import gc

    gpu, children = FakeHostSide(), []
    e = Engine(isolated=True, host_side=gpu, launch=lambda cfg: children.append(FakeChild(cfg)) or children[-1])
    e.update()
    gpu.lagging = True
    e.update()  # the host's stream now waits for a frame the child never finished
    with pytest.warns(ResourceWarning, match="unclosed IsolatedEngine 'CudaEngine'"):
        del e
        gc.collect()
    assert children[0].closed  # the process ends with it; its memory goes with the process
    assert gpu.released and gpu.released[-1] > gpu.sent  # every frame the host's stream waits for is let past
    assert ("close",) not in gpu.calls  # the host's CUDA side keeps its own owners' policy


def test_an_abandoned_isolated_engine_ends_its_process_without_closing_the_cuda_side(iso):
    iso.update()
    iso.abandon()
    assert iso.is_closed and iso.children[0].closed and iso.gpu.calls[-1] == ("abandon",)
    iso.close()  # a no-op now
    assert ("close",) not in iso.gpu.calls


def test_abandoning_a_closed_isolated_engine_leaves_its_closed_cuda_side_alone(iso):
    iso.update()
    iso.close()
    iso.abandon()  # a no-op now: the host's side was closed, not lost
    assert iso.is_closed and iso.gpu.calls[-1] == ("close",) and ("abandon",) not in iso.gpu.calls


def test_isolated_mode_says_plainly_that_it_needs_linux(monkeypatch):
    from cudapatch.isolated import ipc

    monkeypatch.setattr(ipc, "SHARED_PAGES", False)  # as on macOS or Windows: no os.memfd_create
    with pytest.raises(CudapatchError, match=r"Engine\(isolated=True\) needs Linux"):
        Engine(isolated=True)
    with pytest.raises(CudapatchError, match="needs Linux"):
        ipc.FrameWord.create()


def test_a_lagging_child_gets_at_most_three_frames_ahead_and_the_rest_are_dropped(iso):
    _patch(iso)
    iso.update()
    iso.gpu.lagging = True  # the child stops finishing frames (finding a faulting block, or gone)
    sent_before = sum(1 for c in iso.gpu.calls if c[0] == "begin")
    for _ in range(50):
        iso.update()
    sent = sum(1 for c in iso.gpu.calls if c[0] == "begin") - sent_before
    assert sent == 3 and iso.counters.frames_dropped == 47 and iso.counters.frames == 51
    iso.gpu.lagging, iso.gpu.done = False, iso._frame  # it catches up: frames flow again
    iso.update()
    assert iso.gpu.calls[-1] == ("wait", iso._frame)


def test_without_dropping_frames_update_waits_for_a_lagging_child(iso):
    _patch(iso)
    iso.drop_frames = False
    iso.update()
    iso.gpu.lagging = True
    waits = []

    def catch_up(timeout):  # the child finishes one frame each time the host waits on its pipe
        waits.append(timeout)
        iso.gpu.done += 1

    iso.children[0].wait_readable = catch_up
    for _ in range(20):
        iso.update()
    assert iso.counters.frames_dropped == 0 and iso.counters.frames == 21
    assert [m[1] for m in iso.children[0].frames()] == list(range(1, 22))  # every frame sent
    assert len(waits) == 20 - 3  # the child was 1 behind: 2 more ahead, then one wait per frame
    assert all(t <= 0.001 for t in waits)


def test_synchronize_reads_the_pipe_while_a_faulted_childs_frames_never_finish(iso):
    """A faulting child reports and waits for the host to let it go; its frame never finishes. A wait
    on the host's stream alone never ended (``cudapatch run --isolated`` hung on the H100)."""
    f, s = _patch(iso)
    iso.update()
    child = iso.children[0]
    child.inbox.append(("outputs", {(s.id, "Out"): OutputHandle(b"x" * 64, 128, 64, DType.FLOAT32, 256)}, True))
    iso.update()
    iso.gpu.lagging, iso.gpu.done = True, 0
    polls = []

    def report_fault(timeout):
        polls.append(timeout)
        if len(polls) == 3:  # the child named the block by replay: it reports and waits
            why = "CUDA_ERROR_ILLEGAL_ADDRESS in block 'bad' (kernel scale): the block is disabled"
            child.inbox.append(("fault", (("error", s.id, "gpu-fault", why),), {s.id: why}))

    child.wait_readable = report_fault

    class Hook:  # as the GL bridge: copies the last frame in before the host blocks on its stream
        def before_launch(self, stream):
            pass

        def after_launch(self, stream):
            pass

        def before_wait(self):
            assert iso.gpu.done >= iso._frame  # only once no frame the stream waits for can stay unfinished
            iso.gpu.calls.append(("finish GL",))

    iso.add_frame_hook(Hook())
    iso.output(s, "Out")  # mapped here: unmapped once the host's stream is done with it
    iso.synchronize()
    assert len(polls) == 3 and iso.restarts == 1 and len(iso.children) == 2
    assert iso.gpu.released[-1] == 2  # its unfinished frames let past before the host's stream is waited on
    # unmapped after GL's work and the host's stream are done, a new child, then the wait asked for
    expected = [("finish GL",), ("sync",), ("drop",), ("start", 2), ("finish GL",), ("sync",)]
    assert iso.gpu.calls[-6:] == expected


def test_new_outputs_from_a_child_whose_new_graph_faults_do_not_wait_for_its_unfinished_frame(iso):
    """A rebuilt graph's first frame runs before its outputs reach the host; if it faults, the child
    reports and waits. Unmapping the old outputs waits for the host's stream, which waits for that frame:
    the host reads the pipe until the child's frames are done or it ended (then all its memory goes)."""
    f, s = _patch(iso)
    iso.update()
    child = iso.children[0]
    child.inbox.append(("outputs", {(s.id, "Out"): OutputHandle(b"x" * 64, 128, 64, DType.FLOAT32, 256)}, True))
    iso.update()
    assert iso.output(s, "Out") == ("mapped", 128)  # mapped here: the host's stream may read it
    iso.gpu.lagging = True  # the next frames never finish: the new graph faults
    iso.update()
    child.inbox.append(("outputs", {(s.id, "Out"): OutputHandle(b"y" * 64, 0, 64, DType.FLOAT32, 256)}, True))
    reads = []

    def fault_on_second_wait(timeout):
        reads.append(timeout)
        if len(reads) == 2:
            why = "CUDA_ERROR_ILLEGAL_ADDRESS in block 'bad' (kernel scale): the block is disabled"
            child.inbox.append(("fault", (("error", s.id, "gpu-fault", why),), {s.id: why}))

    child.wait_readable = fault_on_second_wait
    iso.update()  # takes the new outputs, waits for the frames (reading the pipe), meets the fault
    assert len(reads) == 2 and iso.restarts == 1 and len(iso.children) == 2
    calls = iso.gpu.calls
    assert calls.index(("sync",)) < calls.index(("drop",))  # every mapping goes, after the stream is done
    assert iso.children[1].frames()  # the new child runs this frame


def test_frame_hooks_without_before_wait_or_failing_in_it_do_not_stop_a_restart(iso):
    f, s = _patch(iso)
    iso.update()

    class Old:  # a hook written before ``before_wait`` existed
        def before_launch(self, stream):
            pass

        def after_launch(self, stream):
            pass

    class Failing(Old):
        def before_wait(self):
            raise RuntimeError("GL error: no context current")

    iso.add_frame_hook(Old())
    iso.add_frame_hook(Failing())
    iso.synchronize()
    why = "CUDA_ERROR_ILLEGAL_ADDRESS in block 'bad' (kernel scale): the block is disabled"
    iso.children[0].inbox.append(("fault", (("error", s.id, "gpu-fault", why),), {s.id: why}))
    iso.update()
    assert iso.restarts == 1 and len(iso.children) == 2 and iso.children[1].frames()


def test_a_child_that_finishes_no_frame_is_reported_stuck_not_waited_for_forever(iso, monkeypatch):
    from cudapatch.isolated import host as host_module

    monkeypatch.setattr(host_module, "REQUEST_TIMEOUT_S", 0.05)
    _patch(iso)
    iso.update()
    iso.gpu.lagging = True
    iso.update()
    with pytest.raises(CudapatchError, match="finished no frame within"):
        iso.synchronize()


def test_the_launcher_starts_the_next_child_in_reserve_and_uses_it_at_a_restart(monkeypatch) -> None:
    from cudapatch.isolated import host_side
    from cudapatch.isolated.protocol import StartConfig

    spawned: list[Any] = []

    class Proc:
        def __init__(self) -> None:
            self.sent: list[Any] = []
            self.alive, self.closed = True, False

        def send(self, m: Any) -> None:
            self.sent.append(m)

        def close(self, timeout: float = 5.0) -> str:
            self.closed = True
            return "exited"

    def spawn(self: Any, fds: tuple[int, ...], device: int) -> Proc:
        spawned.append(Proc())
        return spawned[-1]

    monkeypatch.setattr(host_side.ProcessLauncher, "_spawn", spawn)
    launcher = host_side.ProcessLauncher("python3", standby=True)
    cfg = StartConfig(device=0, name="e", cache_dir=None, wait_for_compile=False, watch_files=False, frame_word_fd=7)
    first = launcher(cfg)
    assert len(spawned) == 2 and first is spawned[0] and first.sent[0][0] == "start" and not spawned[1].sent
    second = launcher(cfg)  # a restart: the reserve, already started, gets the start message
    assert second is spawned[1] and second.sent[0][0] == "start" and len(spawned) == 3
    spawned[2].alive = False  # the reserve died meanwhile: a fresh child instead
    third = launcher(cfg)
    assert third is spawned[3] and spawned[2].closed and len(spawned) == 5
    launcher.close()
    assert spawned[4].closed
    assert not host_side.ProcessLauncher("python3", standby=False)._standby


def test_a_bypass_goes_to_the_child_as_one_edit_and_with_every_whole_patch(iso):
    from cudapatch.isolated.mirror import SetBypassed

    f, s = _patch(iso)
    iso.update()
    child = iso.children[0]
    assert SetBypassed(frozenset()) in child.sent[0][1]  # the whole patch carries the flags
    s.enabled = False
    iso.update()
    assert child.sent[-2] == ("edits", [SetBypassed(frozenset({s.id}))]) and child.sent[-1][0] == "frame"
    assert not iso._dirty.any and iso.counters.rebuilds == 1  # no structure sent for it
    iso.update()
    assert child.sent[-2][0] == "frame"  # nothing more to say
    host = Context()
    for b in (f2 := Fill(name="f2"), s2 := Scale(name="s2")):
        host.register_block(b)
    mirror, patch = PatchMirror_(), ChildPatch(ContextEngine(), lambda h: h)
    patch.apply(mirror.diff(host.snapshot()) + [SetBypassed(frozenset({s2.id}))])
    mirrored = {patch.to_host[b.id]: b for b in patch.engine.context.registry}
    assert not mirrored[s2.id].enabled and mirrored[f2.id].enabled
    assert patch.engine.context.bypassed == {mirrored[s2.id].id}
    patch.apply([SetBypassed(frozenset())])
    assert mirrored[s2.id].enabled and patch.engine.context.bypassed == set()


class Pair(Composite):
    """Two Scales in a row, ``Gain`` setting both factors (the isolated tests' composite)."""

    def compose(self, c) -> None:
        c.add("a", Scale(Factor=2.0))
        c.add("b", Scale())
        c.link("a.Out", "b.In")
        c.expose("In", "a.In")
        c.expose("Out", "b.Out")
        c.expose("Gain", "a.Factor", "b.Factor")


def test_a_composite_reaches_the_child_whole_and_its_inner_blocks_map_to_the_hosts():
    from cudapatch.isolated.mirror import MirrorComposite, patch_view

    host = Context()
    f, pair = host.register_block(Fill(name="f", Count=64)), host.register_block(Pair(name="pair", Gain=3.0))
    host.connect(f, "Out", pair, "In")
    mirror, child = PatchMirror_(), ChildPatch(ContextEngine(), lambda h: h)
    child.apply(pickle.loads(pickle.dumps(mirror.diff(patch_view(host)))))
    _same_patch(host, child)  # flattened on both sides: the same leaves, names, values and links
    mine = child.blocks[pair.id]
    assert isinstance(mine, MirrorComposite) and mine.get("Gain") == 3.0
    assert {blk.name for blk in child.engine.context.registry} == {"f", "pair"}
    a, b = pair.inner("a"), pair.inner("b")
    assert child.inner == {a.id: mine.inner("a"), b.id: mine.inner("b")}
    assert child.to_host[mine.inner("b").id] == b.id
    assert mirror.diff(patch_view(host)) == []
    pair.set("Gain", 5.0)  # Hot: goes with a frame as (pair, Gain); the child's composite takes it
    child.hot(((pair.id, "Gain", 5.0),))
    assert mine.get("Gain") == 5.0
    host.unregister_block(pair)
    child.apply(mirror.diff(patch_view(host)))
    assert child.inner == {} and set(child.to_host.values()) == {f.id}


def test_fuse_goes_to_the_child_engine():
    children = []
    for fuse in (None, False):
        kwargs = {} if fuse is None else {"fuse": fuse}
        e = Engine(
            isolated=True,
            host_side=FakeHostSide(),
            launch=lambda cfg: children.append(FakeChild(cfg)) or children[-1],
            **kwargs,
        )
        e.close()
    assert [c.cfg.fuse for c in children] == [True, False]  # on by default, as Engine


def test_kept_ports_reach_the_child_so_its_fusion_leaves_them_out(iso):
    from cudapatch.isolated.mirror import SetKept

    f, s = _patch(iso)
    t = iso.add(Scale(name="t"))
    iso.connect(s, "Out", t, "In")
    iso.keep(s, "Out")
    iso.update()
    child = iso.children[0]
    assert SetKept(frozenset({(s.id, "Out")})) in child.sent[0][1]
    iso.keep(s, "Out", False)
    iso.update()
    assert SetKept(frozenset()) in child.sent[-2][1]
    # the child side: keeps applied to the mirrored blocks, and let go
    host = Context()
    for b in (f2 := Fill(name="f2"), s2 := Scale(name="s2")):
        host.register_block(b)
    host.connect(f2, "Out", s2, "In")
    host.keep(f2, "Out")
    mirror, patch = PatchMirror_(), ChildPatch(ContextEngine(), lambda h: h)
    patch.apply(pickle.loads(pickle.dumps(mirror.diff(host.snapshot()))))
    mirrored = {patch.to_host[b.id]: b for b in patch.engine.context.registry}
    assert patch.engine.context.kept == {(mirrored[f2.id].id, "Out")}
    host.keep(f2, "Out", False)
    patch.apply(mirror.diff(host.snapshot()))
    assert patch.engine.context.kept == set() and mirror.diff(host.snapshot()) == []


def test_an_output_the_child_holds_in_no_buffer_is_kept_from_the_next_update(iso):
    from cudapatch.isolated.mirror import SetKept

    f, s = _patch(iso)
    t = iso.add(Scale(name="t"))
    iso.connect(s, "Out", t, "In")  # s -> t fuse in the child: s.Out has no buffer there
    iso.update()
    child = iso.children[0]
    child.inbox.append(("outputs", {(t.id, "Out"): OutputHandle(b"x" * 64, 128, 64, DType.FLOAT32, 256)}, True))
    iso.update()
    assert iso.output(t, "Out") == ("mapped", 128) and not iso._dirty.structure  # held: nothing to rebuild
    with pytest.raises(CudapatchError, match="fused kernel"):
        iso.output(s, "Out")
    assert iso._dirty.structure  # the next update sends the keep; the child rebuilds with s.Out in a buffer
    iso.update()
    assert SetKept(frozenset({(s.id, "Out"), (t.id, "Out")})) in child.sent[-2][1]


def test_an_isolated_engine_says_its_graph_runs_in_the_child():
    """What the GL bridge reads to copy outputs after each frame instead of writing them in the graph."""
    from cudapatch import Engine
    from cudapatch.isolated import IsolatedEngine

    assert IsolatedEngine.graph_in_child and not Engine.graph_in_child


def test_frame_finished_says_running_finished_or_never_for_a_child_that_ended(iso):
    """What the GL bridge asks before it copies an isolated engine's outputs: a frame still running is
    not copied yet, and one sent to a child that ended never is (its memory is unmapped here)."""
    f, s = _patch(iso)
    iso.update()
    assert iso.frames_sent == 1 and iso.frame_finished(1) is True
    iso.gpu.lagging = True
    iso.update()
    assert iso.frame_finished(2) is False and iso.frame_finished(1) is True
    child = iso.children[0]
    waits = []

    def finish(timeout):
        waits.append(timeout)
        iso.gpu.done = 2

    child.wait_readable = finish
    assert iso.frame_finished(2, wait=True) is True and waits  # read the pipe until it finished
    iso.update()  # frame 3, never finished: the child faults in it
    why = "CUDA_ERROR_ILLEGAL_ADDRESS in block 'bad' (kernel scale): the block is disabled"
    child.inbox.append(("fault", (("error", s.id, "gpu-fault", why),), {s.id: why}))
    child.wait_readable = lambda timeout: None
    assert iso.frame_finished(3, wait=True) is None  # let past, not finished: nothing to copy
    assert iso.restarts == 1 and iso.frame_finished(2) is None  # the ended child's outputs are gone
    iso.gpu.lagging = False
    iso.update()
    assert iso.frames_sent == 4 and iso.frame_finished(4) is True  # the new child's frames count on


def test_frame_finished_holds_past_two_to_the_31_frames_with_no_child_ended(iso):
    """The host counts frames in Python ints; only the child's frame word wraps (at 2**32)."""
    _patch(iso)
    iso.update()
    iso._frame = iso.gpu.done = iso.gpu.sent = 2**31 + 1  # as after 2**31 frames (25 days at 1 kHz)
    iso.update()
    assert iso.frames_sent == 2**31 + 2 and iso.frame_finished(2**31 + 2) is True


def test_a_wait_that_sees_no_frame_finish_says_where_the_streams_stand(iso, monkeypatch, caplog):
    from cudapatch.isolated import host

    f, s = _patch(iso)
    iso.update()
    iso.gpu.lagging = True
    iso.update()
    clock = iter(range(0, 10_000, 4))  # 4 s a reading: only this module's clock, not pytest's
    fake_time = types.SimpleNamespace(monotonic=lambda: float(next(clock)), perf_counter=time.perf_counter)
    monkeypatch.setattr(host, "time", fake_time)
    child = iso.children[0]
    waits = []

    def finish_late(timeout):
        waits.append(timeout)
        if len(waits) == 5:  # 20 s on the fake clock
            iso.gpu.done = 2

    child.wait_readable = finish_late
    with caplog.at_level("WARNING", logger="cudapatch.isolated"):
        iso.synchronize()
    (warning,) = [r.getMessage() for r in caplog.records if "finished no frame" in r.getMessage()]
    assert "frame 1 done of 2 sent" in warning and "let it start frame 2" in warning, warning


def test_a_child_stuck_past_the_slow_frame_warning_is_still_reported_stuck(iso, monkeypatch, caplog):
    """The warning after ``SLOW_FRAME_S`` comes first; the error after ``REQUEST_TIMEOUT_S`` still comes
    (once warned, the wait logged again at every reading past the deadline and never raised)."""
    from cudapatch.isolated import host

    _patch(iso)
    iso.update()
    iso.gpu.lagging = True
    iso.update()
    now = [0.0]  # the fake clock moves while the host waits on the child's pipe, as time does
    monkeypatch.setattr(host, "time", types.SimpleNamespace(monotonic=lambda: now[0], perf_counter=time.perf_counter))

    def wait_readable(timeout):
        now[0] += 4.0
        assert now[0] < 2 * host.REQUEST_TIMEOUT_S, "waited past the deadline"

    iso.children[0].wait_readable = wait_readable
    with caplog.at_level("WARNING", logger="cudapatch.isolated"), pytest.raises(CudapatchError, match="it is stuck"):
        iso.synchronize()
    assert len([r for r in caplog.records if "has finished no frame for" in r.getMessage()]) == 1


def test_a_hook_that_meets_the_childs_end_before_the_launch_sends_the_frame_to_the_next_child(iso):
    """The GL bridge of an isolated engine waits in ``before_launch`` for the frame it copies (frames
    saved to files); the child may fault meanwhile and a new one start. The frame and the patch go to
    the new child, not to the ended one (seen on the H100: ``cudapatch run --isolated`` then waited
    for good for frames no child had been sent)."""
    f, s = _patch(iso)
    iso.update()
    first = iso.children[0]
    iso.gpu.lagging = True
    iso.update()  # frame 2 never finishes: the child faults in it

    class Bridge:
        def before_launch(self, stream):
            if len(iso.children) == 1:
                why = "CUDA_ERROR_ILLEGAL_ADDRESS in block 'bad' (kernel scale): the block is disabled"
                first.inbox.append(("fault", (("error", s.id, "gpu-fault", why),), {s.id: why}))
                assert iso.frame_finished(iso.frames_sent, wait=True) is None

        def after_launch(self, stream):
            pass

    iso.add_frame_hook(Bridge())
    frames_to_first = len(first.frames())
    iso.gpu.lagging = False
    iso.update()
    second = iso.children[1]
    assert len(first.frames()) == frames_to_first  # nothing more to the ended child
    assert second.frames() == [("frame", 3, ())]
    assert any(isinstance(e, AddBlock) and e.id == f.id for e in second.edits())  # the patch came first
    sent = second.sent
    assert sent.index(next(m for m in sent if m[0] == "edits")) < sent.index(("frame", 3, ()))
    assert iso.frame_finished(3) is True


def test_a_gl_bridge_copies_every_frame_of_a_child_slower_than_the_host(iso):
    """The GL bridge of an isolated engine copies a frame's outputs once the child finished it and
    before the next frame may start (no frame is read while it is written); the engine then sends a
    frame only once the last one finished, or a child slower than the host's frames (2.5 of them a
    frame here) never had the frame sent last finished when the bridge looked, and GL got none."""
    from cudapatch.interop.bridge import GlBridge
    from cudapatch.isolated.host import MAX_FRAMES_AHEAD

    _patch(iso)
    bridge = GlBridge(iso)
    copied = []

    class Group:  # the bridge's mapped GL resources (none shown here: the map is the copy's moment)
        def map(self, stream):
            copied.append((iso.gpu.done, iso.frames_sent))

        def unmap(self):
            pass

    bridge._group = Group()
    iso.gpu.lagging = True
    finish: dict[int, float] = {}  # frame -> the host frame by which the child finished it
    busy = 0.0
    for tick in range(1, 101):
        iso.gpu.done = max((k for k, t in finish.items() if t <= tick), default=0)
        sent = iso.frames_sent
        iso.update()
        if iso.frames_sent != sent:  # the child runs the frames sent one after another
            busy = finish[iso.frames_sent] = max(tick, busy) + 2.5
    assert all(done == sent for done, sent in copied)  # the frame sent last was finished: none running
    assert [done for done, _ in copied] == list(range(1, len(copied) + 1)) and len(copied) >= 30
    assert iso.frames_ahead == 1
    second = GlBridge(iso)
    bridge.close()
    assert iso.frames_ahead == 1  # another bridge still copies
    second.close()
    assert iso.frames_ahead == MAX_FRAMES_AHEAD  # the last one gone: the child may run ahead again


def test_a_gl_bridge_feeds_an_imported_ring_of_an_isolated_engine_without_a_map(iso, monkeypatch):
    """An isolated engine's outputs shown through an imported ring (the preview's zero-map path) are
    copied from the host into the ring (``ImportedRing.write`` on the engine's stream) once the child
    finished the frame, one copy per finished frame; nothing is mapped (a GL map after a child's fault
    hung the preview on the H100), and no writer block goes to the child."""
    from cudapatch.interop.bridge import GlBridge

    _, s = _patch(iso)
    bridge = GlBridge(iso)

    class Ring:  # an ImportedRing fed from the host
        def __init__(self):
            self.writes = []

        def attach(self, writer):  # the graph-fed path: must not be taken
            raise AssertionError("an isolated engine's ring is fed from the host")

        def write(self, ptr, nbytes, stream):
            self.writes.append((ptr, nbytes, iso.gpu.done))
            return True

    class Out:
        ptr, nbytes = 0xB000, 256

    ring = Ring()
    blocks_before = len(iso.blocks)
    bridge.show_buffer_ring(s, "Out", ring)
    assert len(iso.blocks) == blocks_before and bridge.copies
    assert bridge._group is None  # nothing to map
    monkeypatch.setattr(bridge, "output_buffer", lambda block, port: Out() if (block, port) == (s, "Out") else None)
    for _ in range(7):
        iso.gpu.done = iso.frames_sent  # the child finished every frame sent
        iso.update()
    assert [w[:2] for w in ring.writes] == [(0xB000, 256)] * len(ring.writes) and len(ring.writes) >= 5
    assert [w[2] for w in ring.writes] == list(range(1, len(ring.writes) + 1))  # each finished frame, once
    bridge.close()
