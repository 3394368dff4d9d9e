"""DiagnosticBoard and DiagnosticCode without a GPU: sources kept apart, block states set in one place."""

from __future__ import annotations

import logging

import pytest

from cudapatch import Diagnostic, DiagnosticCode, Fill, Scale
from cudapatch.blocks import BlockState
from cudapatch.engine import Context
from cudapatch.engine.board import DiagnosticBoard, running_change
from cudapatch.engine.faults import FaultState


class Compiles:
    """The compile diagnostics as the KernelTracker holds them."""

    def __init__(self) -> None:
        self.diag_version = 0
        self.diags: tuple[Diagnostic, ...] = ()

    def set(self, *diags: Diagnostic) -> None:
        self.diags = diags
        self.diag_version += 1

    def diagnostics(self) -> tuple[Diagnostic, ...]:
        return self.diags


@pytest.fixture
def patch() -> tuple[DiagnosticBoard, Compiles, FaultState, object, object]:
    c = Context()
    fill = c.register_block(Fill(name="fill"))
    scale = c.register_block(Scale(name="scale"))
    compiles, faults = Compiles(), FaultState()
    board = DiagnosticBoard(c.registry, kernels=compiles, faults=faults, logger=logging.getLogger("cudapatch.test"))
    return board, compiles, faults, fill, scale


def test_codes_are_strings_for_hosts() -> None:
    d = Diagnostic("error", 1, "gpu-fault", "boom")
    assert d.code is DiagnosticCode.GPU_FAULT and d.code == "gpu-fault" and f"{d.code}" == "gpu-fault"
    assert {"gpu-fault": 1}[d.code] == 1 and str(d.code) == "gpu-fault"
    same = Diagnostic("error", 1, DiagnosticCode.GPU_FAULT, "boom")
    assert d == same and hash(d) == hash(same) and Diagnostic("error", 1, "gpu-fault", "boom") in {same}
    assert Diagnostic("info", None, "my-host-code", "x").code == "my-host-code"  # a host's own code stays text
    assert len(DiagnosticCode) == 37 and all(c.value == str(c) for c in DiagnosticCode)


def test_a_build_sets_states_and_a_failed_build_keeps_the_running_set(patch) -> None:  # noqa: ANN001
    board, _, _, fill, scale = patch
    warn = Diagnostic("warning", scale.id, "input-unlinked", "block 'scale' is not running\nmore")
    board.build_done((warn,), running=(fill.id,))
    assert fill.debug.state is BlockState.OK and scale.debug.state is BlockState.NOT_COMPILED
    assert scale.debug.message == "block 'scale' is not running" and board.current == (warn,)
    board.build_done((), running=(fill.id, scale.id))
    assert scale.debug.state is BlockState.OK and scale.debug.message == "" and board.current == ()
    err = Diagnostic("error", scale.id, "cycle", "block 'scale' is part of a cycle")
    board.build_failed((err,))
    assert scale.debug.state is BlockState.ERROR and fill.debug.state is BlockState.OK  # the old graph runs
    board.graph_gone()
    assert fill.debug.state is BlockState.NOT_COMPILED and board.current == (err,)


def test_sources_are_replaced_separately(patch) -> None:  # noqa: ANN001
    board, compiles, faults, fill, scale = patch
    board.build_done((), running=(fill.id, scale.id))
    call = Diagnostic("error", scale.id, "library-call", "capture failed (the previous capture keeps running)")
    board.recapture_errors([call])
    full = Diagnostic("warning", fill.id, "append-full", "append output 'fill.Out' is 99% full")
    board.frame_warnings((full,))
    sig = Diagnostic("error", fill.id, "kernel-signature", "cannot re-describe")
    board.set_block_error(sig)
    assert board.current == (call, sig, full)
    assert fill.debug.state is BlockState.ERROR and fill.debug.message == "cannot re-describe"
    board.frame_warnings(())  # a frame without the warning
    board.recapture_errors(())
    assert board.current == (sig,)
    faults.disable(scale.id, "faulted")
    compiles.set(Diagnostic("error", fill.id, "kernel-compile", "k.cu(3): error"))
    board.refresh()  # compile diagnostics changed; faults are read at every publish
    assert [d.code for d in board.current] == ["kernel-signature", "gpu-fault", "kernel-compile"]
    assert board.of_block(scale.id)[0].message == "faulted" and scale.debug.state is BlockState.ERROR
    board.clear_block_error(fill.id, DiagnosticCode.KERNEL_SIGNATURE)
    board.build_done((), running=(fill.id, scale.id))  # a build clears nothing the others own
    assert [d.code for d in board.current] == ["gpu-fault", "kernel-compile"]


def test_an_engine_error_and_each_new_diagnostic_is_logged_once(patch, caplog) -> None:  # noqa: ANN001
    board, _, _, fill, _ = patch
    board.build_done((), running=(fill.id,))
    launch = Diagnostic("error", None, "launch", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")
    with caplog.at_level(logging.INFO, logger="cudapatch.test"):
        board.add_error(launch)
        board.publish()
        board.frame_warnings((Diagnostic("warning", fill.id, "append-full", "full"),))
    assert [r.getMessage() for r in caplog.records] == ["CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "full"]
    assert fill.debug.state is BlockState.WARNING and board.of_block(fill.id)[0].code == "append-full"


def test_an_inner_blocks_diagnostics_show_on_its_composite() -> None:
    from cudapatch import Composite

    class Pair(Composite):
        def compose(self, c) -> None:
            c.add("a", Scale())
            c.expose("In", "a.In")

    c = Context()
    pair = c.register_block(Pair(name="pair"))
    compiles = Compiles()
    board = DiagnosticBoard(
        c.registry, kernels=compiles, faults=FaultState(), logger=logging.getLogger("cudapatch.test")
    )
    inner = pair.inner("a")
    board.build_done((), running=[inner.id, pair.id])
    assert pair.debug.state is BlockState.OK
    compiles.set(Diagnostic("error", inner.id, DiagnosticCode.KERNEL_COMPILE, "kernel 'scale' of 'pair/a': boom"))
    board.refresh()
    assert pair.debug.state is BlockState.ERROR and "boom" in pair.debug.message
    assert [d.block_id for d in board.of_block(pair.id)] == [inner.id]


def _every_block(board: DiagnosticBoard, c: Context) -> dict[int, tuple[BlockState, str]]:
    """What the board's publish set before it wrote only what changed: every registered block's state
    from the running set and the published diagnostics, in publishing order."""
    want = {}
    for b in c.registry:
        state, message = (BlockState.OK if b.id in board._running else BlockState.NOT_COMPILED), ""
        for d in board.current:
            shown = board._shown_on(d.block_id)
            if shown is not b:
                continue
            if d.severity == "error":
                state = BlockState.ERROR
            elif d.severity == "warning" and state is BlockState.OK:
                state = BlockState.WARNING
            if not message or d.severity == "error":
                message = d.message.splitlines()[0]
        want[b.id] = (state, message)
    return want


def test_publishing_writes_only_what_changed_and_every_block_shows_what_a_full_publish_shows() -> None:
    c = Context()
    blocks = [c.register_block(Scale(name=f"s{i}")) for i in range(6)]
    compiles, faults = Compiles(), FaultState()
    board = DiagnosticBoard(c.registry, kernels=compiles, faults=faults, logger=logging.getLogger("cudapatch.test"))

    def check() -> None:
        assert {b.id: (b.debug.state, b.debug.message) for b in c.registry} == _every_block(board, c)

    ids = [b.id for b in blocks]
    board.build_done((), ids[:4])
    check()
    warn = Diagnostic("warning", ids[1], DiagnosticCode.LOW_OCCUPANCY, "slow\nmore")
    err = Diagnostic("error", ids[1], DiagnosticCode.REALIZE, "broken")
    board.build_done((warn, err, Diagnostic("warning", ids[5], DiagnosticCode.LOW_OCCUPANCY, "idle")), ids[:5])
    check()
    assert blocks[1].debug.state is BlockState.ERROR and blocks[1].debug.message == "broken"
    blocks[0].debug.state = BlockState.ERROR  # written elsewhere: it stops running, so it is written again
    board.build_done((warn,), ids[1:3])  # 0 and 3, 4 stop running, 5's warning goes
    check()
    late = c.register_block(Fill(name="late"))
    late.debug.state, late.debug.message = BlockState.ERROR, "stale"
    compiles.set(Diagnostic("error", ids[2], DiagnosticCode.KERNEL_COMPILE, "nvrtc"))
    board.refresh()  # a new block is written at the next publish
    check()
    assert late.debug.state is BlockState.NOT_COMPILED and blocks[2].debug.message == "nvrtc"
    gone = blocks[3]
    c.unregister_block(gone)
    c.register_block(gone)  # removed and added back between two publishes
    gone.debug.state = BlockState.ERROR
    board.build_done((), [*ids, late.id])
    check()
    board.graph_gone()
    check()
    assert all(b.debug.state is not BlockState.OK for b in c.registry)


def test_a_running_change_made_off_the_frame_thread_writes_what_a_plain_one_writes() -> None:
    """The build thread compares a new plan's blocks with what the board shows running
    (``running_change``); the swap frame uses that difference only if the board still shows that set,
    else it compares again: every block ends as after a full publish either way."""
    c = Context()
    blocks = [c.register_block(Scale(name=f"s{i}")) for i in range(8)]
    ids = [b.id for b in blocks]
    board = DiagnosticBoard(c.registry, kernels=Compiles(), faults=FaultState(), logger=logging.getLogger("t"))

    def check() -> None:
        assert {b.id: (b.debug.state, b.debug.message) for b in c.registry} == _every_block(board, c)

    board.build_done((), ids[:4])
    made = running_change(ids[2:7], board.running)  # on the build thread, against what shows now
    assert made.changed == frozenset(ids[:2] + ids[4:7])
    board.build_done((), made)
    check()
    assert board.running == frozenset(ids[2:7]) and blocks[0].debug.state is BlockState.NOT_COMPILED
    stale = running_change(ids[:3], frozenset(ids[:4]))  # made against a set no longer shown
    board.build_done((), stale)
    check()
    assert [b.debug.state is BlockState.OK for b in blocks] == [True] * 3 + [False] * 5
