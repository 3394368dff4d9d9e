"""Parameter storage and captured-call bookkeeping without a GPU: the bytes a kernel node would read,
the storage a Cold rebuild borrows and gives back, and how a Warm resize moves captured calls.

(cuda-bindings' parameter structs are plain host objects; nothing here calls the driver.)
"""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest

from cudapatch import (
    Block,
    BlockBuilder,
    CallDescriptor,
    DType,
    Scale,
    buffer_in,
    buffer_out,
    compile_plan,
    device_scalar,
    host_scalar,
    like,
)
from cudapatch.engine import Context, ExternalBinding, KernelNodePlan
from cudapatch.engine.captured_calls import CallArg, CapturedCall, CapturedCalls
from cudapatch.engine.params import (
    BUFFER_FROM_ARGS,
    PackedLaunch,
    ParamStorage,
    StoreLoans,
    _layout,
    give_back,
    new_storage,
    read_slot,
    stock_spares,
    write_slot,
)


def _scale_node(factor: float = 2.0, count: int = 1000) -> KernelNodePlan:
    s = Scale(name="s", Factor=factor)
    ctx = Context()
    ctx.register_block(s)
    ctx.bind_input(s, "In", ExternalBinding(0x7000_0000, count, DType.FLOAT32))
    (node,) = compile_plan(ctx.snapshot()).kernel_nodes
    return node


# Scale's launch: (const float* in, float* out, float factor, float offset, uint n)
VALUES = [0x7000_0000, 0x8000_0000, 2.5, -1.0, 1000]


def _argument_bytes(store: ParamStorage) -> list[bytes]:
    """What the driver reads through ``kernelParams``: each argument's bytes, via the pointer array."""
    offsets, _ = store.descriptor.offsets
    sizes = [s.size for s in store.descriptor.slots]
    array = (ctypes.c_void_p * len(offsets)).from_address(store.params.kernelParams)
    return [ctypes.string_at(p, n) for p, n in zip(array, sizes, strict=True)]


def test_storage_packs_every_argument_where_the_launch_reads_it() -> None:
    node = _scale_node()
    store = ParamStorage(node, 42, VALUES)
    raw = _argument_bytes(store)
    assert raw[0] == (0x7000_0000).to_bytes(8, "little") and raw[1] == (0x8000_0000).to_bytes(8, "little")
    assert raw[2] == bytes(ctypes.c_float(2.5)) and raw[3] == bytes(ctypes.c_float(-1.0))
    assert raw[4] == (1000).to_bytes(4, "little")
    kp = store.params
    assert (int(kp.func), kp.gridDimX, kp.blockDimX, kp.sharedMemBytes) == (42, node.grid, node.block, 0)
    assert [read_slot(s) for s in store.slots] == VALUES
    # A Hot update writes a slot: the launch reads the new value through the same struct.
    write_slot(store.slots[2], 7.0)
    assert _argument_bytes(store)[2] == bytes(ctypes.c_float(7.0))


def test_backup_and_restore_undo_a_load() -> None:
    """A failed rebuild gives borrowed storage back as it was, the function included (the struct's
    ``func`` getter returns a view of the field: a backup holding it would follow the next load)."""
    node = _scale_node()
    store = ParamStorage(node, 42, VALUES)
    saved = store.backup()
    other = node._replace(grid=9)
    store.load(other, 43, [1, 2, 3.0, 4.0, 5])
    assert [read_slot(s) for s in store.slots] == [1, 2, 3.0, 4.0, 5] and store.params.gridDimX == 9
    store.restore(saved)
    assert [read_slot(s) for s in store.slots] == VALUES
    assert (int(store.params.func), store.params.gridDimX) == (42, node.grid)


def _fused_node(blocks: int) -> KernelNodePlan:
    ctx = Context()
    chain = [ctx.register_block(Scale(name=f"s{i}", Factor=1.0 + i, Offset=-float(i))) for i in range(blocks)]
    for a, b in zip(chain, chain[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    ctx.bind_input(chain[0], "In", ExternalBinding(0x7000_0000, 1000, DType.FLOAT32))
    (node,) = compile_plan(ctx.snapshot(), fuse=True).kernel_nodes
    return node


def test_a_kernel_with_many_arguments_hands_the_driver_one_buffer() -> None:
    """``extra`` = {BUFFER_POINTER: the storage, BUFFER_SIZE: its size, END}; the size ends at the last
    argument (the driver refuses tail padding); ``kernelParams`` is unset. A Hot write lands in it."""
    node = _fused_node(8)  # In, its count, Out, 16 scalars, the count: 20 arguments
    values = [0x7000_0000, 1000, 0x8000_0000, *(float(k) for k in range(16)), 1000]
    assert len(values) >= BUFFER_FROM_ARGS
    store = ParamStorage(node, 42, values)
    kp = store.params
    assert kp.kernelParams == 0 and kp.extra != 0
    key, buf, key2, size_at, end = (ctypes.c_void_p * 5).from_address(kp.extra)
    size = ctypes.c_size_t.from_address(size_at).value
    assert (key, key2, end) == (1, 2, None) and buf == ctypes.addressof(store.storage)
    assert size == 8 + 4 + 4 + 8 + 16 * 4 + 4  # u64, u32, (pad to 8), u64, 16 f32, u32: no tail padding
    raw = ctypes.string_at(buf, size)
    assert raw[:8] == (0x7000_0000).to_bytes(8, "little") and raw[-4:] == (1000).to_bytes(4, "little")
    assert raw[24:28] == bytes(ctypes.c_float(0.0)) and raw[28:32] == bytes(ctypes.c_float(1.0))
    write_slot(store.slots[4], 9.5)  # Hot: the second scalar
    assert ctypes.string_at(buf, size)[28:32] == bytes(ctypes.c_float(9.5))
    # A small kernel keeps its pointer array.
    small = ParamStorage(_scale_node(), 42, VALUES)
    assert small.params.extra == 0 and small.params.kernelParams != 0


def test_a_storage_with_one_buffer_launches_alone_with_it(monkeypatch) -> None:
    import cudapatch.kernels._driver as driver_module

    seen = []

    class Driver:
        CUDA_KERNEL_NODE_PARAMS = driver_module.driver().CUDA_KERNEL_NODE_PARAMS

        def cuLaunchKernel(self, *a):  # noqa: N802
            seen.append(a[-2:])
            return (0,)

    node = _fused_node(8)
    store = ParamStorage(node, 42, [0x7000_0000, 1000, 0x8000_0000, *(float(k) for k in range(16)), 1000])
    monkeypatch.setattr(driver_module, "_driver", Driver())
    assert store.launch_alone(0) == 0
    assert seen == [(0, store.params.extra)]


def test_vector_slots_take_tuples() -> None:
    slot = (ctypes.c_float * 2)()
    write_slot(slot, (1.5, -2.0))
    assert read_slot(slot) == (1.5, -2.0)
    scalar = ctypes.c_int32()
    write_slot(scalar, 7)
    assert read_slot(scalar) == 7


def test_loans_reuse_a_fitting_storage_once_and_give_it_back_on_failure() -> None:
    node = _scale_node()
    running = ParamStorage(node, 42, VALUES)
    loans = StoreLoans({(node.block_id, node.kernel): running})
    resized = node._replace(grid=2)
    got = loans.storage(resized, 44, [1, 2, 3.0, 4.0, 300])
    assert got is running and read_slot(running.slots[4]) == 300 and running.params.gridDimX == 2
    again = loans.storage(resized, 44, [1, 2, 3.0, 4.0, 300])
    assert again is not running  # lent once: a second node of the same key gets its own
    loans.restore()  # the build failed: the running graph reads its old values again
    assert [read_slot(s) for s in running.slots] == VALUES and running.params.gridDimX == node.grid


def test_loans_do_not_reuse_a_storage_of_another_layout() -> None:
    node = _scale_node()
    running = ParamStorage(node, 42, VALUES)
    loans = StoreLoans({(node.block_id, node.kernel): running})
    other = _other_descriptor_node(node)
    got = loans.storage(other, 44, [1, 2])
    assert got is not running and not running.fits(other)
    loans.restore()
    assert [read_slot(s) for s in running.slots] == VALUES


def _other_descriptor_node(node: KernelNodePlan) -> KernelNodePlan:
    desc = node.descriptor
    return node._replace(descriptor=dataclasses.replace(desc, parameters=desc.parameters[:2]), args=node.args[:2])


# -- spare storages (a closed graph's, loaded again by a later build) ----------------------------


def _launch_config(store: ParamStorage) -> tuple:
    """The function, grid, block, shared memory and the y/z dimensions: what ``backup`` keeps besides the bytes."""
    return store.backup()[1:]


def _poison(store: ParamStorage) -> None:
    """What a closed graph may have left: other bytes, a specialised function, another launch shape."""
    ctypes.memset(store.storage, 0xAB, len(store.storage))
    kp = store.params
    kp.func, kp.gridDimX, kp.gridDimY, kp.blockDimY, kp.sharedMemBytes = 99, 77, 5, 3, 123


@pytest.fixture
def no_spares():
    """Spares are kept per layout for the whole process: each test starts and ends without any."""
    layouts = [_layout(_scale_node().descriptor), _layout(_fused_node(8).descriptor)]
    for lay in layouts:
        lay.spares.clear()
    yield layouts
    for lay in layouts:
        lay.spares.clear()


@pytest.mark.parametrize("fused", [False, True], ids=["pointer array", "one buffer"])
def test_a_spare_is_loaded_whole_as_a_new_storage_would_be(no_spares, fused) -> None:
    node = _fused_node(8) if fused else _scale_node()
    rng = np.random.default_rng()
    scalars = [float(np.float32(v)) for v in rng.standard_normal(16)]
    values = [0x7000_0000, 1000, 0x8000_0000, *scalars, 1000] if fused else [0x7100_0000, 0x8100_0000, *scalars[:2], 77]
    old = ParamStorage(node, 42, [v * 2 if isinstance(v, float) else v + 8 for v in values], owner=7)
    _poison(old)
    give_back([old], 7)
    resized = node._replace(grid=node.grid + 3, shared_bytes=64)
    got = new_storage(resized, 44, values, owner=9)
    fresh = ParamStorage(resized, 44, values)
    assert got is old and got.owner == 9 and not _layout(node.descriptor).spares
    assert _launch_config(got) == _launch_config(fresh)
    if fused:  # the driver reads ``size`` bytes of the one buffer through ``extra``
        _, buf, _, size_at, _ = (ctypes.c_void_p * 5).from_address(got.params.extra)
        size = ctypes.c_size_t.from_address(size_at).value
        assert buf == ctypes.addressof(got.storage) and got.params.kernelParams == 0
        assert ctypes.string_at(buf, size) == bytes(fresh.storage)[:size]
    else:
        assert _argument_bytes(got) == _argument_bytes(fresh)


def test_only_the_owner_gives_a_storage_back_and_a_lent_one_is_the_borrowers(no_spares) -> None:
    node = _scale_node()
    spares = _layout(node.descriptor).spares
    running = ParamStorage(node, 42, VALUES, owner=1)
    other, unowned = ParamStorage(node, 42, VALUES, owner=2), ParamStorage(node, 42, VALUES)
    give_back([other, unowned], 1)
    give_back([unowned], 0)
    assert not spares
    loans = StoreLoans({(node.block_id, node.kernel): running}, owner=5)
    assert loans.storage(node, 43, VALUES) is running and running.owner == 5
    give_back([running], 1)  # the graph that lent it closes: the new graph's node still uses it
    assert not spares
    loans.restore()  # that build failed: the storage is the lender's again
    assert running.owner == 1
    give_back([running, running], 1)  # (given back once)
    assert spares == [running] and running.owner == 0


def test_a_spare_refusing_values_stays_a_spare(no_spares) -> None:
    node = _scale_node()
    spare = ParamStorage(node, 42, VALUES, owner=3)
    give_back([spare], 3)
    with pytest.raises(ValueError):
        new_storage(node, 42, VALUES[:3])
    assert _layout(node.descriptor).spares == [spare]


def test_stocking_makes_one_spare_per_storage_less_those_there_are(no_spares) -> None:
    scale, fused = _scale_node(), _fused_node(8)
    values = [0x7000_0000, 1000, 0x8000_0000, *(float(k) for k in range(16)), 1000]
    stores = [ParamStorage(scale, 42, VALUES) for _ in range(150)] + [ParamStorage(fused, 43, values)] * 2
    _layout(scale.descriptor).spares.append(ParamStorage(scale, 42, VALUES))
    asked = []

    def stop() -> bool:  # a build comes after the first piece: the rest is handed back
        asked.append(1)
        return len(asked) == 2

    rest = stock_spares(stores, stop)
    assert rest is not None and 0 < len(_layout(scale.descriptor).spares) < 150
    assert rest() is None
    assert len(_layout(scale.descriptor).spares) == 150 and len(_layout(fused.descriptor).spares) == 2
    made = _layout(scale.descriptor).spares[-1]
    assert made.owner == 0 and made not in stores
    taken = new_storage(scale, 44, VALUES)
    assert taken is made and _argument_bytes(taken) == _argument_bytes(ParamStorage(scale, 44, VALUES))
    assert stock_spares(stores) is None and len(_layout(scale.descriptor).spares) == 150  # the one taken, made again
    before = list(_layout(scale.descriptor).spares)
    assert stock_spares(stores) is None and _layout(scale.descriptor).spares == before  # none short: none made
    _layout(scale.descriptor).spares.clear()
    assert stock_spares(stores, give_up=lambda: True) is None and not _layout(scale.descriptor).spares


def test_packed_launch_points_at_its_values() -> None:
    values = (ctypes.c_uint64(0xABC), ctypes.c_uint32(7))
    launch = PackedLaunch(99, values, threads=128)
    kp = launch.params
    assert (int(kp.func), kp.gridDimX, kp.blockDimX) == (99, 1, 128)
    array = (ctypes.c_void_p * 2).from_address(kp.kernelParams)
    assert ctypes.c_uint64.from_address(array[0]).value == 0xABC
    assert ctypes.c_uint32.from_address(array[1]).value == 7


# -- captured calls ----------------------------------------------------------------------------


def _axpy(stream, pointers, scalars, libs):  # never called here: no capture without a GPU
    raise AssertionError("a unit test must not capture")


AXPY = CallDescriptor.of(
    "axpy",
    buffer_in("X", "float"),
    buffer_out("Y", "float"),
    host_scalar("N", "int"),
    device_scalar("Alpha", "float"),
    double=False,
)


class Axpy(Block):
    type_name = "Axpy"

    def describe(self, b: BlockBuilder) -> None:
        c = b.add_captured(_axpy, AXPY)
        b.input("X", c.in_("X"))
        b.output("Y", c.out("Y"), size=like("X"))
        c.set_count("N", like("X"))
        b.scalar("Alpha", c.in_("Alpha"), default=2.0)


class _Slot:
    """Stands in for a DeviceSlot (whose writes copy to the device)."""

    def __init__(self, value: float, device: int) -> None:
        self.value, self.device, self.writes = value, device, []

    def __setattr__(self, name, v):
        if name == "value" and hasattr(self, "writes"):
            self.writes.append(v)
        object.__setattr__(self, name, v)


def _axpy_plans(*counts: int):
    a = Axpy(name="a")
    ctx = Context()
    ctx.register_block(a)
    plans = []
    for n in counts:
        ctx.bind_input(a, "X", ExternalBinding(0x1000, n, DType.FLOAT32))
        (node,) = compile_plan(ctx.snapshot()).captured_nodes
        plans.append(node)
    return a, plans


def _call(node, device: _Slot) -> CapturedCall:
    return CapturedCall(node, [0x1000, 0x2000, node.args[2].value, 2.0], "a", {3: device})


def test_a_call_splits_its_arguments_for_the_call_function() -> None:
    _, (node,) = _axpy_plans(256)
    call = _call(node, _Slot(2.0, 0xD000))
    pointers, scalars = call.arguments()
    assert pointers == {"X": 0x1000, "Y": 0x2000, "Alpha": 0xD000}  # a device scalar goes by address
    assert scalars == {"N": 256, "double": False}
    assert isinstance(call.slots[2], CallArg) and call.slots[3] is not None
    call.slots[2].value = 256
    assert not call.dirty  # the same value: nothing to re-capture
    call.slots[2].value = 128
    assert call.dirty and call.values[2] == 128


def _values(a):
    return {"external": 0x1000, "buffer": 0x2000}.get(a.kind, a.value)


def test_a_warm_resize_recaptures_only_calls_whose_host_arguments_changed(monkeypatch) -> None:
    _, (old, same, smaller) = _axpy_plans(256, 256, 128)
    alpha = _Slot(2.0, 0xD000)
    call = _call(old, alpha)
    calls = CapturedCalls(None)
    calls.add(call)
    recaptured = []
    monkeypatch.setattr(calls, "recapture", lambda exec_, c: recaptured.append(list(c.values)) or True)
    alpha_changed = same._replace(args=(*same.args[:3], same.args[3]._replace(value=0.5)))
    assert calls.patch("exec", [(call, alpha_changed)], _values) == 0
    assert recaptured == [] and alpha.writes == [0.5] and call.plan is alpha_changed  # a device write, no capture
    assert calls.patch("exec", [(call, smaller)], _values) == 1
    assert recaptured == [[0x1000, 0x2000, 128, 2.0]] and call.plan is smaller


def test_a_failed_recapture_leaves_the_call_as_it_was(monkeypatch) -> None:
    a, (old, smaller) = _axpy_plans(256, 128)
    call = _call(old, _Slot(2.0, 0xD000))
    calls = CapturedCalls(None)
    calls.add(call)

    def topology_changed(exec_, c):
        calls.stale = c.stale = True
        calls.errors[a.id] = RuntimeError("x")  # type: ignore[assignment]
        return False

    monkeypatch.setattr(calls, "recapture", topology_changed)
    assert calls.patch("exec", [(call, smaller)], _values) is None
    assert call.values[2] == 256 and call.plan is old  # the running capture's values
    assert calls.stale is False and a.id not in calls.errors  # the Cold rebuild decides now
    assert calls.stale_nodes() == frozenset({old.index})  # ... and this call needs it


def test_calls_find_their_capture_by_block() -> None:
    a, (node,) = _axpy_plans(256)
    call = _call(node, _Slot(2.0, 0xD000))
    call.child = "captured-graph"
    calls = CapturedCalls(None)
    calls.add(call)
    assert len(calls) == 1 and calls.child_graph(a.id) == "captured-graph" and calls.child_graph(a.id, 1) is None
    calls.abandon()
    assert call.child is None


@pytest.mark.parametrize("bad", [[1, 2, 3.0, 4.0], [1, 2, 3.0, 4.0, 5, 6]])
def test_storage_refuses_a_wrong_number_of_values(bad) -> None:
    with pytest.raises(ValueError):
        ParamStorage(_scale_node(), 42, bad)


def _mixed_node() -> KernelNodePlan:
    """Scale's launch with a by-value parameter of each lane type and alignment in between."""
    from cudapatch.kernels.descriptor import KernelParamDescriptor as P

    node = _scale_node()
    params = (
        P("a", DType.FLOAT32, True),
        P("h", DType.FLOAT16, False),
        P("v", DType.FLOAT3, False),
        P("c", DType.UINT8, False),
        P("w", DType.FLOAT4, False),
        P("s", DType.INT16, False),
        P("d", DType.DOUBLE2, False),
        P("u", DType.UCHAR4, False),
        P("n", DType.UINT64, False),
    )
    return node._replace(descriptor=dataclasses.replace(node.descriptor, parameters=params))


MIXED = [0x7000_0000, 1.5, (1.0, -2.0, 3.25), 200, (0.5, 1.5, 2.5, 3.5), -7, (1e300, -2.0), (1, 2, 3, 255), 2**63]


def _slot_by_slot(store: ParamStorage, values) -> bytes:
    """The storage's bytes after writing ``values`` through ctypes slots one by one (the reference)."""
    for slot, v in zip(store.slots, values, strict=True):
        write_slot(slot, v)
    return bytes(store.storage)


def test_packed_load_writes_what_the_slots_would() -> None:
    node = _mixed_node()
    store = ParamStorage(node, 42, MIXED)  # one struct.pack_into
    packed = bytes(store.storage)
    ctypes.memset(store.storage, 0, len(store.storage))
    assert _slot_by_slot(store, MIXED) == packed
    assert [read_slot(s) for s in store.slots] == MIXED
    assert store.slots[1:3] == [store.slots[1], store.slots[2]] and len(store.slots) == len(MIXED)


@pytest.mark.parametrize("index, value", [(2, (1e40, 0.0, 0.0)), (5, 40_000), (8, -1), (0, 2**64 + 5)])
def test_values_struct_refuses_are_written_as_a_c_cast_does(index, value) -> None:
    """A float over float32's range, a short or a pointer out of range: the ctypes slots take them as before."""
    values = list(MIXED)
    values[index] = value
    store = ParamStorage(_mixed_node(), 42, values)
    reference = ParamStorage(_mixed_node(), 42, MIXED)
    assert bytes(store.storage) == _slot_by_slot(reference, values)


def test_a_wrong_value_type_still_raises() -> None:
    values = list(MIXED)
    values[3] = 2.5  # uchar
    with pytest.raises(TypeError):
        ParamStorage(_mixed_node(), 42, values)
