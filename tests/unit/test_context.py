"""Registry, connections, external bindings and dirty tracking (no GPU)."""

from __future__ import annotations

import random

import pytest

from cudapatch import DType, Fill, Scale, VectorAdd
from cudapatch.engine import Context, DirtyTracker, ExternalBinding
from cudapatch.errors import BindingError, CudapatchError, LinkError


def _ctx(*blocks):
    c = Context()
    for b in blocks:
        c.register_block(b)
    c.dirty.clear_structure()
    return c


def test_dirty_tracker_priorities() -> None:
    d = DirtyTracker()
    assert d.structure and d.any and d.tier == "structure"
    d.mark_param(1, "F")
    d.mark_code("k")
    d.clear_structure()  # a rebuild applies everything
    assert not d.any and d.tier == "clean" and not d.params and not d.code
    d.mark_param(1, "F")
    assert d.tier == "params" and d.only_params
    d.mark_captured("gemm")
    assert d.tier == "captured" and not d.only_params
    d.mark_code("k")
    assert d.tier == "code"
    d.mark_structure()
    assert d.tier == "structure"
    d.clear_structure()
    d.mark_binding(1, "In", None)
    params, bindings = d.take_params()
    assert not params and set(bindings) == {(1, "In")} and not d.any


def test_dirty_tracker_flags_follow_the_change_sets_through_any_sequence() -> None:
    """``any`` and ``beyond_params`` are kept as flags (the frame path reads them); after every call they
    say what the sets say, whatever the order of marks, takes and clears."""
    import random

    steps = [
        lambda d: d.mark_param(1, "F", 1.0),
        lambda d: d.mark_binding(1, "In", 0xA000),
        lambda d: d.mark_code("k"),
        lambda d: d.mark_captured("gemm"),
        lambda d: d.mark_structure(),
        lambda d: d.mark_bypass(),
        lambda d: d.take_bypass(),
        lambda d: d.take_code(),
        lambda d: d.take_params(),
        lambda d: d.swap_params(({}, {})),
        lambda d: d.defer_structure(),
        lambda d: d.forget_code_and_captured(),
        lambda d: d.clear_structure(),
    ]
    rng = random.Random(5)
    d = DirtyTracker()
    for _ in range(2000):
        rng.choice(steps)(d)
        beyond = bool(d.structure or d.code or d.captured)
        assert d.beyond_params == beyond and d.only_params == (not beyond)
        assert d.any == bool(beyond or d.params or d.bindings or d.bypass)


def test_names_stay_taken_and_free_as_blocks_are_renamed_registered_and_removed_in_any_order() -> None:
    # Property: the registry refuses a name exactly when a registered block has it now (the check is
    # an index the renames keep, not a scan), and ``by_name`` finds the first registered holder.
    rng = random.Random(20261127)
    names = ["a", "b", "c", "d"]
    c = Context()
    pool = [Scale(name=rng.choice(names)) for _ in range(8)]
    for _ in range(3000):
        block = rng.choice(pool)
        step = rng.randrange(3)
        if step == 0:  # register
            taken = any(b.name == block.name for b in c.registry if b is not block)
            if block.context is c:
                continue
            if taken:
                with pytest.raises(CudapatchError, match="another block already has this name"):
                    c.register_block(block)
                assert block.context is None
            else:
                c.register_block(block)
        elif step == 1:  # a host's rename, registered or not (a rename may make two of a name)
            block.name = rng.choice(names)
        else:
            c.unregister_block(block)
        for name in names:
            holders = [b for b in c.registry if b.name == name]
            assert c.registry.by_name(name) is (holders[0] if holders else None)


def test_register_unregister_and_names() -> None:
    a, b = Scale(name="a"), Scale(name="a")
    c = _ctx(a)
    with pytest.raises(CudapatchError, match="another block already has this name"):
        c.register_block(b)
    assert c.registry.by_name("a") is a and len(c.registry) == 1
    c.unregister_block(a)
    assert a.context is None and c.dirty.structure
    c.unregister_block(a)  # unknown: ignored


def test_connect_validates_immediately() -> None:
    f, s, add = Fill(name="f"), Scale(name="s"), VectorAdd(name="add")
    c = _ctx(f, s, add)
    c.connect(f, "Out", s, "In")
    assert c.dirty.structure
    with pytest.raises(LinkError, match="unknown output port .*outputs: Out"):
        c.connect(f, "Value", s, "In")
    with pytest.raises(LinkError, match="is an input; links start at an output"):
        c.connect(s, "In", add, "A")
    with pytest.raises(LinkError, match="unknown input port .*inputs: A, B"):
        c.connect(s, "Out", add, "C")
    with pytest.raises(LinkError, match="is an output; links end at an input"):
        c.connect(s, "Out", add, "Sum")
    with pytest.raises(LinkError, match="would make a cycle"):
        c.connect(s, "Out", s, "In")
    c.connect(s, "Out", add, "A")
    with pytest.raises(LinkError, match="cycle"):
        c.connect(add, "Sum", s, "In")  # replacing f -> s with add -> s would close a loop


def test_connect_type_mismatch_and_other_engine() -> None:
    from cudapatch import AppendFilter

    class IntSource(Fill):
        type_name = "IntSource"

    a, b = Scale(name="a"), Scale(name="b")
    c1, c2 = _ctx(a), _ctx(b)
    with pytest.raises(LinkError, match="belongs to another engine"):
        c1.connect(a, "Out", b, "In")
    loose = Scale(name="loose")
    with pytest.raises(LinkError, match="not registered"):
        c1.connect(a, "Out", loose, "In")
    with pytest.raises(CudapatchError, match="registered with another engine"):
        c1.register_block(b)
    assert AppendFilter  # the append output is float: links into float inputs are fine
    af = AppendFilter(name="af")
    c1.register_block(af)
    c1.connect(af, "Kept", a, "In")
    assert c2 is not c1


def test_input_link_is_replaced_and_removed_with_blocks() -> None:
    f1, f2, s = Fill(name="f1"), Fill(name="f2"), Scale(name="s")
    c = _ctx(f1, f2, s)
    c.connect(f1, "Out", s, "In")
    c.connect(f2, "Out", s, "In")
    assert [(lk.src, lk.dst_port) for lk in c.connections] == [(f2.id, "In")]
    c.unregister_block(f2)
    assert len(c.connections) == 0
    assert not c.disconnect(f1, "Out", s, "In")


def test_bindings_choose_warm_or_cold() -> None:
    s = Scale(name="s")
    c = _ctx(s)
    c.bind_input(s, "In", ExternalBinding(0x1000, 100, DType.FLOAT32))
    assert c.dirty.structure  # first binding: Cold
    c.dirty.clear_structure()
    c.bind_input(s, "In", ExternalBinding(0x2000, 100, DType.FLOAT32))
    assert not c.dirty.structure and (s.id, "In") in c.dirty.bindings  # same size: Warm
    c.bind_input(s, "In", ExternalBinding(0x3000, 101, DType.FLOAT32))
    assert c.dirty.structure  # new size: Cold
    with pytest.raises(BindingError, match="holds int but the port takes float"):
        c.bind_input(s, "In", ExternalBinding(0x3000, 101, DType.INT32))
    with pytest.raises(BindingError, match="unknown input port"):
        c.bind_input(s, "Out", ExternalBinding(0x3000, 101, DType.FLOAT32))
    assert c.unbind_input(s, "In") and not c.unbind_input(s, "In")


def test_parameter_changes_mark_hot_or_structure() -> None:
    f = Fill(name="f")
    c = _ctx(f)
    f.set("Value", 2.0)
    assert not c.dirty.structure and set(c.dirty.params) == {(f.id, "Value")}
    assert c.dirty.params[(f.id, "Value")] is f.params["Value"]
    f.set("Count", 10)  # sizes depend on it
    assert c.dirty.structure
    c.unregister_block(f)
    c.dirty.clear_structure()
    f.set("Value", 5.0)  # no longer registered: no events
    assert not c.dirty.any


def test_snapshot_is_a_copy() -> None:
    s = Scale(name="s", Factor=2.0)
    c = _ctx(s)
    snap = c.snapshot()
    s.set("Factor", 5.0)
    assert snap.blocks[0].values["Factor"] == 2.0 and snap.context_id == c.id


def test_a_snapshot_refreezes_only_the_blocks_that_changed() -> None:
    from cudapatch import Scale
    from cudapatch.engine.context import Context

    ctx = Context()
    a, b, c = (ctx.register_block(Scale(name=n, Factor=1.0)) for n in "abc")
    first = {s.id: s for s in ctx.snapshot().blocks}
    a.set("Factor", 2.0)  # a Hot value
    b.name = "bee"  # a rename (the host adapter's)
    second = {s.id: s for s in ctx.snapshot().blocks}
    assert second[c.id] is first[c.id]
    assert second[a.id] is not first[a.id] and second[a.id].values["Factor"] == 2.0
    assert second[b.id].name == "bee"
    ctx.unregister_block(c)
    assert [s.id for s in ctx.snapshot().blocks] == [a.id, b.id]


def test_a_changed_description_drops_only_that_blocks_links_to_ports_it_lost() -> None:
    f, a, s, t = Fill(name="f"), Scale(name="a"), Scale(name="s"), Scale(name="t")
    c = _ctx(f, a, s, t)
    c.connect(f, "Out", a, "In")
    c.connect(a, "Out", s, "In")
    c.connect(s, "Out", t, "In")
    s.description = Fill(name="s").description  # no input any more; its output stays
    c.on_structure_changed(s)
    assert [(lk.src, lk.dst) for lk in c.connections] == [(f.id, a.id), (s.id, t.id)] and c.dirty.structure
