"""FaultState without a GPU: when a disabled block, a failed library call or a lost input is forgiven."""

from __future__ import annotations

from cudapatch import DiagnosticCode, Fill, Scale
from cudapatch.engine import Context
from cudapatch.engine.faults import FaultState


def _patch() -> tuple[Context, object, object]:
    c = Context()
    fill = c.register_block(Fill(name="fill", Count=64))
    scale = c.register_block(Scale(name="scale"))
    c.connect(fill, "Out", scale, "In")
    return c, fill, scale


def _snap_block(c: Context, block: object) -> object:
    return next(b for b in c.snapshot().blocks if b.id == block.id)  # type: ignore[attr-defined]


def test_a_disabled_block_stays_disabled_until_its_code_changes_or_it_goes() -> None:
    f = FaultState()
    f.disable(3, "illegal address in block 'x'")
    f.disable(4, "illegal address in block 'y'")
    assert dict(f.disabled) == {3: "illegal address in block 'x'", 4: "illegal address in block 'y'"}
    f.patch_edited()  # other edits forgive nothing here
    assert f.is_disabled(3)
    assert f.code_changed(3) and not f.code_changed(3) and not f.is_disabled(3)
    f.block_removed(4)
    assert not f.disabled and not f.diagnostics()


def test_diagnostics_name_disabled_blocks_lost_inputs_and_a_lost_context() -> None:
    f = FaultState()
    f.disable(3, "faulted")
    f.inputs_lost([(5, "In", "ext.In"), (6, "B", "add.B")])
    diags = f.diagnostics()
    assert [(d.severity, d.block_id, d.code) for d in diags] == [
        ("warning", 5, DiagnosticCode.BINDING_LOST),
        ("warning", 6, DiagnosticCode.BINDING_LOST),
        ("error", 3, DiagnosticCode.GPU_FAULT),
    ]
    assert "'ext.In'" in diags[0].message and "bind it again" in diags[0].message
    f.input_bound(5, "In")
    f.block_removed(6)
    assert [d.code for d in f.diagnostics()] == ["gpu-fault"]
    f.inputs_lost([(7, "In", "k.In")])
    f.mark_lost("the GPU context is lost: restart")
    assert f.lost == "the GPU context is lost: restart"
    assert [(d.block_id, d.code) for d in f.diagnostics()] == [(None, "gpu-lost"), (3, "gpu-fault")]


def test_a_failed_call_stays_out_until_its_values_change_or_the_patch_is_edited() -> None:
    c, fill, scale = _patch()
    f = FaultState()
    status = {(fill.id, 0): ("info", "kernel-compiling", "compiling")}  # type: ignore[attr-defined]
    assert f.with_call_failures(c.snapshot().blocks, status) is status  # nothing failed: unchanged
    assert f.call_failed(_snap_block(c, scale), "cublasSgemm: not supported")
    assert not f.call_failed(_snap_block(c, scale), "again")  # a second failure of one block: give up
    out = f.with_call_failures(c.snapshot().blocks, status)
    assert out[(scale.id, 0)] == ("error", DiagnosticCode.LIBRARY_CALL, "cublasSgemm: not supported")  # type: ignore[attr-defined]
    assert out[(fill.id, 0)] == status[(fill.id, 0)] and len(status) == 1  # type: ignore[attr-defined]
    assert f.failed_calls == {scale.id}  # type: ignore[attr-defined]
    scale.set("Factor", 7.0)  # type: ignore[attr-defined]
    assert (scale.id, 0) not in f.with_call_failures(c.snapshot().blocks, status)  # type: ignore[attr-defined]
    assert not f.failed_calls
    f.call_failed(_snap_block(c, scale), "failed")
    f.patch_edited()
    assert not f.failed_calls and f.call_failed(_snap_block(c, scale), "tried again")
    c.unregister_block(scale)  # type: ignore[arg-type]
    assert f.with_call_failures(c.snapshot().blocks, {}) == {} and not f.failed_calls
