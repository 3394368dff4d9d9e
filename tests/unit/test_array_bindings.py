"""Binding arrays of every element type: ``__cuda_array_interface__`` arrays (CuPy, Numba, PyTorch) and
host arrays of each NumPy dtype bind to ports of their type and are refused elsewhere with a message
that says what the port takes; DLPack carries what the array interface cannot (PyTorch's bfloat16),
read from real DLPack capsules (NumPy's own, and ones built here the way a producer builds them)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

from cudapatch import Shape
from cudapatch.engine.bindings import (
    binding_from_cai,
    checked_host_values,
    device_binding,
    host_values,
    port_takes,
)
from cudapatch.engine.dlpack import DLPACK_CPU, DLPACK_CUDA, _DLManagedTensor, dlpack_device, read_dlpack
from cudapatch.errors import BindingError
from cudapatch.kernels.types import DType, bfloat16_bits

from .shape_blocks import Copy
from .test_live_builds import engine, realizer  # noqa: F401 (fixtures)

#: Port type -> the NumPy dtype of the arrays that bind to it, and a trailing axis for vector types.
LISTED = {
    DType.INT8: (np.int8, ()),
    DType.UINT8: (np.uint8, ()),
    DType.INT16: (np.int16, ()),
    DType.UINT16: (np.uint16, ()),
    DType.FLOAT16: (np.float16, ()),
    DType.BFLOAT16: (np.uint16, ()),  # its bits
    DType.FLOAT2: (np.float32, (2,)),
    DType.FLOAT3: (np.float32, (3,)),
    DType.FLOAT4: (np.float32, (4,)),
    DType.UCHAR4: (np.uint8, (4,)),
}


class _Cai:
    """Device memory as ``__cuda_array_interface__`` describes it (a CuPy array's, without a GPU)."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, ptr: int = 0x7000_0000) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": np.dtype(dtype).str,
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi)
)
_DLTENSOR = b"dltensor"  # the capsule keeps a pointer to its name: a module constant outlives it
_CODES = {"int": 0, "uint": 1, "float": 2, "bfloat": 4, "bool": 6}


class _Tensor:
    """A DLPack producer the way PyTorch is one for a tensor on ``device``: ``__dlpack__`` hands out a
    'dltensor' capsule of a ``DLManagedTensor`` describing ``values`` (or ``ptr``, device memory), of
    type ``code``/``bits``; ``__cuda_array_interface__`` refuses with ``cai_error`` (PyTorch's answer
    for bfloat16) or is absent."""

    def __init__(
        self,
        values: np.ndarray,
        code: str,
        bits: int,
        *,
        device: int = DLPACK_CUDA,
        ptr: int | None = None,
        cai_error: str | None = None,
    ) -> None:
        self.values = values
        self.device = device
        self.cai_error = cai_error
        self.streams: list[Any] = []
        self._shape = (ctypes.c_int64 * values.ndim)(*values.shape)
        self._strides = (ctypes.c_int64 * values.ndim)(*(s // values.itemsize for s in values.strides))
        self._managed = _DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = ptr if ptr is not None else values.ctypes.data
        t.device.device_type, t.device.device_id = device, 0
        t.ndim = values.ndim
        t.dtype.code, t.dtype.bits, t.dtype.lanes = _CODES[code], bits, 1
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))

    @property
    def __cuda_array_interface__(self) -> dict:
        if self.cai_error is None or self.device != DLPACK_CUDA:
            raise AttributeError("no __cuda_array_interface__ on a CPU tensor")
        raise TypeError(self.cai_error)

    def __dlpack__(self, stream: Any = None) -> Any:
        self.streams.append(stream)
        return _capsule_new(ctypes.addressof(self._managed), _DLTENSOR, None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device, 0)


def _bf16_tensor(n: int, **kw: Any) -> _Tensor:
    bits = bfloat16_bits(np.linspace(-2.0, 2.0, n))
    return _Tensor(bits, "bfloat", 16, cai_error="dtype torch.bfloat16 is not supported", **kw)


# -- __cuda_array_interface__ (CuPy, Numba, PyTorch) ------------------------------------------------
@pytest.mark.parametrize("want", LISTED, ids=lambda d: d.c_name)
def test_device_arrays_of_each_listed_type_bind_with_its_dtype(want: DType) -> None:
    dt, lanes = LISTED[want]
    b = binding_from_cai(_Cai((48, 64, *lanes), dt), want, "blk", "In")
    assert b.dtype is want and b.count == 48 * 64 and b.shape == Shape.of(48, 64) and b.ptr == 0x7000_0000
    flat = device_binding(_Cai((100 * want.lanes,), dt), want, "blk", "In")
    assert flat is not None and flat.count == 100 and flat.shape is None


@pytest.mark.parametrize("want", LISTED, ids=lambda d: d.c_name)
def test_a_device_array_of_another_lane_type_is_refused_saying_what_the_port_takes(want: DType) -> None:
    wrong = np.float64 if want.base != np.float64 else np.float32
    with pytest.raises(BindingError, match=f"array of float64 bound to a {want.c_name} port, which takes") as err:
        binding_from_cai(_Cai((64,), wrong), want, "blk", "In")
    assert err.value.block == "blk" and err.value.port == "In" and port_takes(want) in str(err.value)


@pytest.mark.parametrize(
    ("array_dtype", "port"),
    [
        (np.uint8, DType.INT8),
        (np.int8, DType.UINT8),
        (np.uint16, DType.INT16),
        (np.int16, DType.UINT16),
        (np.float16, DType.UINT16),
        (np.float16, DType.BFLOAT16),
        (np.float32, DType.FLOAT16),
        (np.uint8, DType.FLOAT4),
        (np.float32, DType.UCHAR4),
    ],
)
def test_same_size_types_of_another_kind_are_refused(array_dtype: Any, port: DType) -> None:
    with pytest.raises(BindingError, match=f"bound to a {port.c_name} port"):
        binding_from_cai(_Cai((64,), array_dtype), port, "blk", "In")


def test_what_each_port_says_it_takes() -> None:
    assert port_takes(DType.FLOAT16) == "float16 arrays"
    assert port_takes(DType.UCHAR4) == "uint8 arrays, 4 values per element (e.g. a last axis of 4)"
    assert "torch.bfloat16" in port_takes(DType.BFLOAT16) and "bfloat16_bits" in port_takes(DType.BFLOAT16)


def test_vector_ports_need_whole_elements() -> None:
    with pytest.raises(BindingError, match="array of 10 values is not a whole number of float4"):
        binding_from_cai(_Cai((10,), np.float32), DType.FLOAT4, "blk", "In")
    b = binding_from_cai(_Cai((30, 40, 3), np.float32), DType.FLOAT3, "blk", "In")
    assert b.count == 1200 and b.shape == Shape.of(30, 40)


# -- DLPack --------------------------------------------------------------------------------------------
def test_read_dlpack_reads_numpys_own_capsules() -> None:
    a = np.arange(24, dtype=np.int16).reshape(4, 6)
    v = read_dlpack(a)
    assert (v.ptr, v.shape, v.type_name, v.numpy, v.device) == (a.ctypes.data, (4, 6), "int16", a.dtype, DLPACK_CPU)
    assert v.contiguous and not v.on_device
    sliced = read_dlpack(a[:, ::2])
    assert sliced.type_name == "int16" and not sliced.contiguous
    assert read_dlpack(np.zeros(3, np.float16)).numpy == np.float16
    assert dlpack_device(a) == DLPACK_CPU and dlpack_device(object()) is None


def test_a_bfloat16_device_tensor_binds_through_dlpack_where_the_array_interface_refuses() -> None:
    bits = bfloat16_bits(np.linspace(-2.0, 2.0, 48)).reshape(6, 8)
    t = _Tensor(bits, "bfloat", 16, ptr=0x5000_0000, cai_error="dtype torch.bfloat16 is not supported")
    b = device_binding(t, DType.BFLOAT16, "blk", "In", stream=0x1234)
    assert b is not None and (b.ptr, b.count, b.dtype, b.shape) == (0x5000_0000, 48, DType.BFLOAT16, Shape.of(6, 8))
    assert b.owner is t  # the tensor keeps its memory alive while bound
    assert t.streams == [0x1234]  # the producer orders its pending writes before the engine's stream


@pytest.mark.parametrize("port", [DType.UINT16, DType.INT16, DType.FLOAT16, DType.FLOAT32])
def test_a_bfloat16_tensor_is_refused_by_every_other_port(port: DType) -> None:
    with pytest.raises(BindingError, match=f"array of bfloat16 bound to a {port.c_name} port, which takes"):
        device_binding(_bf16_tensor(16, ptr=0x5000_0000), port, "blk", "In")


def test_dlpack_device_tensors_of_the_other_types_bind_by_their_lanes() -> None:
    half = _Tensor(np.zeros((4, 5, 4), np.float16), "float", 16, ptr=0x6000_0000)
    b = device_binding(half, DType.FLOAT16, "blk", "In")
    assert b is not None and b.count == 80 and b.shape == Shape((4, 5, 4), 1)
    rgba = _Tensor(np.zeros((4, 5, 4), np.uint8), "uint", 8, ptr=0x6000_0000)
    b = device_binding(rgba, DType.UCHAR4, "blk", "In")
    assert b is not None and b.count == 20 and b.shape == Shape.of(4, 5)
    with pytest.raises(BindingError, match="array of int8 bound to a uchar port"):
        device_binding(_Tensor(np.zeros(8, np.int8), "int", 8, ptr=0x6000_0000), DType.UINT8, "blk", "In")
    with pytest.raises(BindingError, match="not C-contiguous"):
        device_binding(_Tensor(np.zeros((4, 6), np.int16)[:, ::2], "int", 16, ptr=0x6000_0000), DType.INT16, "b", "In")


def test_a_refused_interface_without_a_device_export_is_a_clear_error() -> None:
    class Refuses:
        @property
        def __cuda_array_interface__(self) -> dict:
            raise TypeError("dtype torch.bool is not supported")

    with pytest.raises(BindingError, match="refuses __cuda_array_interface__ .*torch.bool.* no DLPack export"):
        device_binding(Refuses(), DType.UINT8, "blk", "In")
    booleans = _Tensor(np.zeros(8, np.uint8), "bool", 8, ptr=0x6000_0000, cai_error="dtype torch.bool")
    with pytest.raises(BindingError, match="cannot bind the array through DLPack: DLPack type code 6"):
        device_binding(booleans, DType.UINT8, "blk", "In")


def test_host_arrays_are_not_device_bindings() -> None:
    assert device_binding(np.zeros(4, np.float32), DType.FLOAT32, "blk", "In") is None
    cpu = _bf16_tensor(4, device=DLPACK_CPU)
    assert device_binding(cpu, DType.BFLOAT16, "blk", "In") is None


# -- host arrays ------------------------------------------------------------------------------------
def test_a_cpu_bfloat16_tensor_is_read_as_its_bits_and_binds_only_to_bfloat16() -> None:
    class NoNumpy(_Tensor):  # NumPy cannot convert a torch.bfloat16 tensor: only DLPack reads it
        def __array__(self, *a: Any, **k: Any) -> Any:
            raise TypeError("Got unsupported ScalarType BFloat16")

    bits = bfloat16_bits(np.linspace(-1.0, 1.0, 12)).reshape(3, 4)
    t = NoNumpy(bits, "bfloat", 16, device=DLPACK_CPU)
    values, source = host_values(t, "blk", "In")
    assert source == "bfloat16" and values.dtype == np.uint16 and values.shape == (3, 4)
    np.testing.assert_array_equal(values, bits)
    assert values.ctypes.data != bits.ctypes.data  # a copy: the tensor may change after bind
    assert checked_host_values(t, DType.BFLOAT16, "blk", "In").shape == (3, 4)
    with pytest.raises(BindingError, match="host array of bfloat16 bound to a ushort port"):
        checked_host_values(t, DType.UINT16, "blk", "In")


@pytest.mark.parametrize("want", LISTED, ids=lambda d: d.c_name)
def test_host_arrays_of_each_listed_type_pass_and_others_are_refused(want: DType) -> None:
    dt, lanes = LISTED[want]
    ok = np.zeros((8, 8, *lanes), dt)
    assert checked_host_values(ok, want, "blk", "In").dtype == dt
    with pytest.raises(BindingError, match=f"host array of float64 bound to a {want.c_name} port, which takes"):
        checked_host_values(np.zeros(8 * want.lanes), want, "blk", "In")


def test_unreadable_host_data_is_a_binding_error() -> None:
    with pytest.raises(BindingError, match="cannot read the host array"):
        checked_host_values(["a", object()], DType.FLOAT32, "blk", "In")


def test_engine_bind_takes_a_bfloat16_tensor_and_refuses_a_mismatch(engine: Any) -> None:  # noqa: F811
    bf = engine.add(Copy(name="bf", Type="bfloat16"))
    half = engine.add(Copy(name="half", Type="half"))
    t = _bf16_tensor(256, ptr=0x5000_0000)
    engine.bind(bf, "In", t)
    binding = engine.context.snapshot().bindings[(bf.id, "In")]
    assert (binding.ptr, binding.count, binding.dtype) == (0x5000_0000, 256, DType.BFLOAT16)
    with pytest.raises(BindingError, match="array of bfloat16 bound to a half port") as err:
        engine.bind(half, "In", t)
    assert err.value.block == "half" and (half.id, "In") not in engine.context.snapshot().bindings
    with pytest.raises(BindingError, match="host array of float32 bound to a half port, which takes float16"):
        engine.bind(half, "In", np.zeros(16, np.float32))


def test_a_real_torch_bfloat16_cpu_tensor_reads_as_its_bits() -> None:
    torch = pytest.importorskip("torch")
    t = torch.linspace(-3.0, 3.0, 20, dtype=torch.bfloat16).reshape(4, 5)
    values, source = host_values(t, "blk", "In")
    assert source == "bfloat16" and values.shape == (4, 5)
    np.testing.assert_array_equal(values, t.view(torch.int16).numpy().view(np.uint16))


def test_a_bfloat16_tensor_whose_array_interface_gives_an_opaque_type_binds_through_dlpack() -> None:
    """The PyTorch on the H100 host exports a bfloat16 tensor's ``__cuda_array_interface__`` with an
    opaque typestr (two bytes, ``V2``) instead of refusing it: DLPack names the type."""

    class Opaque(_Tensor):
        @property
        def __cuda_array_interface__(self) -> dict:
            return {"shape": (48,), "typestr": self.typestr, "data": (0x5000_0000, False), "version": 3}

    bits = bfloat16_bits(np.linspace(-2.0, 2.0, 48))
    for typestr in ("<V2", "|V2"):
        t = Opaque(bits, "bfloat", 16, ptr=0x5000_0000)
        t.typestr = typestr
        b = device_binding(t, DType.BFLOAT16, "blk", "In", stream=0x1234)
        assert b is not None and (b.ptr, b.count, b.dtype) == (0x5000_0000, 48, DType.BFLOAT16)
