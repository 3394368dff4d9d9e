"""Turning what users bind to input ports (CuPy/Numba/PyTorch arrays, host arrays) into ExternalBindings.

Device arrays come through ``__cuda_array_interface__`` (CuPy, Numba, PyTorch), or through DLPack
where that interface refuses (PyTorch's bfloat16 tensors: ``engine/dlpack.py``). An array binds to a
port when its values are the port's lane type (``DType.accepts``); anything else is refused with a
``BindingError`` that says what the port takes.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ..blocks.shape import shape_from_array
from ..errors import BindingError
from ..kernels.types import DType
from .buffers import BufferPool, GpuBuffer
from .context import ExternalBinding
from .dlpack import DLPACK_CPU, DLPACK_CUDA_HOST, DlpackView, dlpack_device, read_dlpack

__all__ = [
    "binding_from_cai",
    "checked_host_values",
    "device_binding",
    "host_values",
    "port_takes",
    "upload_host_array",
    "DeviceArray",
]


def port_takes(want: DType) -> str:
    """What arrays a port of element type ``want`` takes, for error messages."""
    if want is DType.BFLOAT16:
        return "torch.bfloat16 tensors, or bfloat16 bits as uint16/int16 (cudapatch.kernels.types.bfloat16_bits)"
    lane = want.base.name
    if want.lanes > 1:
        return f"{lane} arrays, {want.lanes} values per element (e.g. a last axis of {want.lanes})"
    return f"{lane} arrays"


def _refused(source: str, want: DType, block: str, port: str, *, host: bool = False) -> BindingError:
    what = "host array" if host else "array"
    return BindingError(
        f"{what} of {source} bound to a {want.c_name} port, which takes {port_takes(want)}", block=block, port=port
    )


def _binds(source: str, dtype: np.dtype | None, want: DType) -> bool:
    """Whether values of ``source`` (a type name; ``dtype`` its NumPy dtype, None for bfloat16) bind to
    a ``want`` port. bfloat16 values bind to bfloat16 ports only, never to ushort or half."""
    if source == "bfloat16":
        return want is DType.BFLOAT16
    return dtype is not None and want.accepts(dtype)


class DeviceArray:
    """Raw device memory (a mapped GL buffer, a host application's allocation) as a
    ``__cuda_array_interface__`` that ``Engine.bind`` accepts: ``count`` elements of ``dtype``
    (with ``shape``, a ``Shape`` of that count, the array has its axes).
    It owns nothing: whoever gave the pointer keeps the memory alive while it is bound."""

    def __init__(self, ptr: int, count: int, dtype: DType, *, shape: Any = None) -> None:
        if shape is not None and shape.count == count:  # a Shape: the array has its axes
            dims = (
                shape.dims
                + ((shape.channels,) if shape.channels > 1 else ())
                + ((dtype.lanes,) if dtype.lanes > 1 else ())
            )
        else:
            dims = (count * dtype.lanes,)
        self.__cuda_array_interface__ = {
            "shape": dims,
            "typestr": np.dtype(dtype.base).str,
            "data": (int(ptr), False),
            "version": 3,
            "strides": None,
        }


def upload_host_array(
    array: Any,
    want: DType,
    owned: dict[tuple[int, str], GpuBuffer],
    key: tuple[int, str],
    pool: BufferPool,
    stream: Any,
    block: str,
) -> ExternalBinding:
    """Copy a host array into the engine-owned buffer for ``key`` (reused while the size stays).

    Raises:
        BindingError: the element type does not match the port.
        CudaError: the upload failed.
    """
    host = checked_host_values(array, want, block, key[1])
    count = host.size // want.lanes
    buf = owned.get(key)
    if buf is None or buf.count != count:
        if buf is not None:
            buf.close()
        buf = GpuBuffer(pool, want, count, stream=stream)
        owned[key] = buf
    buf.upload(host.view(want.base) if host.dtype != want.base else host)
    shape = shape_from_array(host.shape, want.lanes) if host.ndim > 1 else None
    return ExternalBinding(buf.ptr, count, want, owner=buf, shape=shape)


_TYPESTR_CACHE: dict[str, np.dtype] = {}


def host_values(array: Any, block: str, port: str) -> tuple[np.ndarray, str]:
    """A host array's values as a C-contiguous NumPy array, and the name of their type: ``bfloat16``
    for a bfloat16 DLPack tensor (a CPU ``torch.bfloat16`` tensor, which NumPy cannot convert),
    whose bits come back as uint16; else the NumPy dtype's name.

    Raises:
        BindingError: neither NumPy nor DLPack can read the array.
    """
    try:
        host = np.ascontiguousarray(array)
        if host.dtype != object:
            return host, host.dtype.name
        error = f"NumPy reads it as {host.dtype} values"
    except (TypeError, ValueError, RuntimeError) as exc:
        error = str(exc)
    if dlpack_device(array) == DLPACK_CPU:
        try:
            view = read_dlpack(array)
        except TypeError as exc:
            raise BindingError(f"cannot read the host array: {exc}", block=block, port=port) from None
        lane = view.numpy if view.numpy is not None else np.dtype(np.uint16)  # bfloat16: its bits
        if not view.contiguous:
            raise BindingError("array is not C-contiguous; bind a contiguous copy", block=block, port=port)
        count = math.prod(view.shape)
        raw = (ctypes.c_byte * (count * lane.itemsize)).from_address(view.ptr) if count else b""
        values = np.frombuffer(raw, dtype=lane).copy().reshape(view.shape)  # a copy: the tensor may change
        return values, view.type_name
    raise BindingError(f"cannot read the host array: {error}", block=block, port=port)


def checked_host_values(array: Any, want: DType, block: str, port: str) -> np.ndarray:
    """``host_values`` of an array bound to a ``want`` port, its type checked against the port's.

    Raises:
        BindingError: unreadable, or of another element type.
    """
    host, source = host_values(array, block, port)
    if not _binds(source, host.dtype, want):
        raise _refused(source, want, block, port, host=True)
    return host


def device_binding(
    array: Any, want: DType, block: str, port: str, *, stream: int | None = None
) -> ExternalBinding | None:
    """The binding of a device array (``__cuda_array_interface__``, or DLPack on a CUDA device where
    that interface refuses, as PyTorch does for bfloat16), or None for anything else (a host array).

    Args:
        stream: The engine stream's handle, for a DLPack producer to order its pending writes before.

    Raises:
        BindingError: the element type does not match the port, non-contiguous memory, or a device
            array that neither interface exports.
    """
    try:
        cai = array.__cuda_array_interface__
    except AttributeError:  # no interface (a host array, a CPU tensor)
        refused = None
    except (TypeError, ValueError, RuntimeError, BufferError) as exc:  # torch: bfloat16 has no typestr
        refused = exc
    else:
        typestr = cai["typestr"]
        if typestr[1:2] != "V":
            return binding_from_cai(array, want, block, port, cai=cai)
        # An opaque element type ("<V2": the PyTorch on the H100 host exports bfloat16 so; NumPy reads it
        # as "|V2"): DLPack names the type.
        refused = TypeError(f"__cuda_array_interface__ gives the opaque type '{typestr}'")
    device = dlpack_device(array)
    if device in (None, DLPACK_CPU, DLPACK_CUDA_HOST):  # pinned host memory is copied like host arrays
        if refused is not None:
            raise BindingError(
                f"the array refuses __cuda_array_interface__ ({refused}) and has no DLPack export on a CUDA device",
                block=block,
                port=port,
            )
        return None
    try:
        view = read_dlpack(array, stream=stream)
    except TypeError as exc:
        raise BindingError(f"cannot bind the array through DLPack: {exc}", block=block, port=port) from None
    return binding_from_dlpack(view, array, want, block, port)


def binding_from_dlpack(view: DlpackView, owner: Any, want: DType, block: str, port: str) -> ExternalBinding:
    """The binding of a DLPack tensor on the device (``owner`` keeps its memory alive).

    Raises:
        BindingError: wrong element type, non-contiguous, or not a whole number of vector elements.
    """
    if not _binds(view.type_name, view.numpy, want):
        raise _refused(view.type_name, want, block, port)
    if not view.contiguous:
        raise BindingError("array is not C-contiguous; bind a contiguous copy", block=block, port=port)
    size = math.prod(view.shape)
    if size % want.lanes:
        raise BindingError(f"array of {size} values is not a whole number of {want.c_name}", block=block, port=port)
    shape = shape_from_array(view.shape, want.lanes) if len(view.shape) > 1 else None
    return ExternalBinding(view.ptr, size // want.lanes, want, owner=owner, shape=shape)


def binding_from_cai(array: Any, want: DType, block: str, port: str, *, cai: Any = None) -> ExternalBinding:
    """The binding of an array with ``__cuda_array_interface__`` (``cai``: the interface, if read).

    Raises:
        BindingError: wrong element type, non-contiguous, or not a whole number of vector elements.
    """
    # A Warm rebind happens every frame in some patches (ping-pong buffers), so this stays lean.
    if cai is None:
        cai = array.__cuda_array_interface__
    shape = cai["shape"]
    typestr = cai["typestr"]
    dt = _TYPESTR_CACHE.get(typestr)
    if dt is None:
        try:
            dt = _TYPESTR_CACHE[typestr] = np.dtype(typestr)
        except TypeError:
            raise BindingError(f"unsupported array type '{typestr}'", block=block, port=port) from None
    if dt != want.base and not want.accepts(dt):
        raise _refused(str(dt), want, block, port)
    size = math.prod(shape)
    strides = cai.get("strides")
    if strides is not None and size > 1:
        acc = dt.itemsize
        for n, st in zip(reversed(shape), reversed(strides), strict=False):
            if n > 1 and st != acc:
                raise BindingError("array is not C-contiguous; bind a contiguous copy", block=block, port=port)
            acc *= n
    if size % want.lanes:
        raise BindingError(f"array of {size} values is not a whole number of {want.c_name}", block=block, port=port)
    shape_ = shape_from_array(shape, want.lanes) if len(shape) > 1 else None
    return ExternalBinding(int(cai["data"][0]), size // want.lanes, want, owner=array, shape=shape_)
