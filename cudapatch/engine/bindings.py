"""Turning what users bind to input ports (CuPy/Numba/PyTorch arrays, host arrays) into ExternalBindings."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..blocks.shape import shape_from_array
from ..errors import BindingError
from ..kernels.types import DType
from .buffers import BufferPool, GpuBuffer
from .context import ExternalBinding

__all__ = ["binding_from_cai", "upload_host_array", "DeviceArray"]


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
    host = np.ascontiguousarray(array)
    if not want.accepts(host.dtype):
        raise BindingError(f"host array of {host.dtype} bound to a {want.c_name} port", block=block, port=key[1])
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


def binding_from_cai(array: Any, want: DType, block: str, port: str) -> ExternalBinding:
    # A Warm rebind happens every frame in some patches (ping-pong buffers), so this stays lean.
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
        raise BindingError(f"array of {dt} bound to a {want.c_name} port", block=block, port=port)
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
