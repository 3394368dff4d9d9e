"""The frame path's driver calls, made without letting go of the GIL.

cuda-bindings releases the GIL around every driver call. For a call of a few microseconds that is a
loss: a background thread that wants the GIL (a build, the kernel builder, deferred freeing) takes
it at that moment, and the frame thread waits to get it back, up to the interpreter's switch
interval (0.1 ms while a build runs, 5 ms otherwise) plus the thread's wake-up. A frame with 20 Hot
values makes 21 such calls: 20 ``cuGraphExecKernelNodeSetParams`` and the launch took a median of
0.84 ms and up to 1.8 ms beside a thread running Python at the 0.1 ms interval (61 ms at 5 ms),
against 0.034 ms (max 0.13) with all 21 made with the GIL held (H100 host, ``cuda-bindings`` 13,
``benchmarks/probes/probe_held_calls.py``). The frame guard (``pacing.FrameGuard``) stops a build
only at its checkpoints; a held call leaves no opening at all.

Held here, the two calls a Hot, Warm or Bypass edit makes per node: ``cuGraphExecKernelNodeSetParams``
and ``cuGraphNodeSetEnabled``. Each returns in microseconds and waits for no Python thread (no host
callback runs inside them), so holding the GIL through them cannot deadlock. They are the driver's
own entry points (``cuGetProcAddress`` for the bindings' CUDA version, so the parameter struct is the
one the bindings fill) called through ``ctypes`` with the Python calling convention (``PYFUNCTYPE``:
the GIL stays held), and they take and return what the bindings' functions do (handles and parameter
objects in, a ``(CUresult,)``-like tuple out), so callers do not change. The result's code is a plain
int: ``_driver.check`` names it as the driver does. ``FrameCalls.raw`` gives the entry points
themselves, on plain values, to callers that keep those (a bypass toggle and a one-change Hot or Warm
patch: ``CompiledGraph``): the wrapper's two ``int()`` and ``getPtr()`` were a quarter of a held call
(H200 host: ``cuGraphNodeSetEnabled`` 1.60 µs through the wrapper, 1.23 on values; the bindings' 0.91).

``cuGraphLaunch`` is not held: it waits when the GPU is behind and its launch queue is full, and a
frame loop faster than the GPU would then hold the GIL from every other thread nearly all the time
(a build would never land). It is one opening per frame, at its end.

Holding the GIL through a driver call also holds it while that call waits inside the driver (for
its lock, where another thread is in ``cuGraphInstantiate`` or a module load): every Python thread
waits then, not only the frame thread, which waited anyway.

Where the driver module is not the bindings' (a stand-in on a machine without a GPU), or a test
replaced one of its functions, or the driver does not give the entry point, the bindings' own
function is used (a resolution that failed is logged once and tried again with the next graph).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from ._driver import bindings_major, driver

__all__ = ["FrameCalls", "RawCalls", "frame_calls"]

log = logging.getLogger("cudapatch.kernels")

_VOID_P = ctypes.c_void_p
#: name -> the C prototype (all return ``CUresult``, an int)
_PROTOTYPES = {
    # (exec, node, params*)
    "cuGraphExecKernelNodeSetParams": ctypes.PYFUNCTYPE(ctypes.c_int, _VOID_P, _VOID_P, _VOID_P),
    "cuGraphNodeSetEnabled": ctypes.PYFUNCTYPE(ctypes.c_int, _VOID_P, _VOID_P, ctypes.c_uint),  # (exec, node, on)
}


class RawCalls(NamedTuple):
    """The two held calls on plain values, the entry points themselves: handles as ints (``int()`` of
    a bindings handle), parameters by address (``getPtr()``); each returns the ``CUresult`` as an int.
    A caller that keeps those values (a bypass toggle's step, a node's ``hid``) skips the wrapper and
    its conversions (two ``int()`` and a ``getPtr()`` a call). It must not keep them past the
    executable's life: a destroyed executable's value is no NULL the driver refuses."""

    set_params: Callable[[int, int, int], int]
    set_enabled: Callable[[int, int, int], int]


class FrameCalls(NamedTuple):
    """The frame path's three driver calls, each shaped as the bindings' function of that name (the
    launch is always the driver module's own), and ``raw``: the same two held calls on plain values
    where both are held (else None: the driver's own functions, a stand-in's or a replacement)."""

    launch: Callable[[Any, Any], tuple[Any]]
    set_params: Callable[[Any, Any, Any], tuple[Any]]
    set_enabled: Callable[[Any, Any, int], tuple[Any]]
    raw: RawCalls | None = None


def frame_calls() -> FrameCalls:
    """The driver calls for a graph's frame path: held ones where the driver is the bindings' own and
    the function was not replaced, else the driver module's functions."""
    d = driver()
    held = _held_calls(d)

    def pick(name: str) -> Callable[..., Any]:
        current = getattr(d, name)
        fn = held.get(name)
        return fn if fn is not None and _bindings_own(current, name) else current

    set_params, set_enabled = pick("cuGraphExecKernelNodeSetParams"), pick("cuGraphNodeSetEnabled")
    raw_params, raw_enabled = getattr(set_params, "raw", None), getattr(set_enabled, "raw", None)
    raw = RawCalls(raw_params, raw_enabled) if raw_params is not None and raw_enabled is not None else None
    return FrameCalls(d.cuGraphLaunch, set_params, set_enabled, raw)


def _bindings_own(fn: Any, name: str) -> bool:
    """Whether ``fn`` is the bindings' function ``name`` (not one a test put in its place; by name, not
    identity: it may have been replaced before the first look)."""
    return getattr(fn, "__module__", None) == _BINDINGS and getattr(fn, "__name__", None) == name


_BINDINGS = "cuda.bindings.driver"
_held: dict[str, Callable[..., tuple[int]]] | None = None  # the held calls, once resolved (None: not yet)
_said = False  # whether a resolution that failed was logged


def _held_calls(d: Any) -> dict[str, Callable[..., tuple[int]]]:
    global _held
    if getattr(d, "__name__", None) != _BINDINGS:  # a stand-in driver: its own functions
        return {}
    if _held is None:
        _held = _resolve(d)  # (a failure is not kept: asked again with the next graph)
    return _held or {}


def _resolve(bindings: Any) -> dict[str, Callable[..., tuple[int]]] | None:
    global _said
    # The entry points of the bindings' CUDA version take the parameter struct the bindings fill:
    # ``CUDA_KERNEL_NODE_PARAMS_v2`` in CUDA 12 and 13 (another struct: the bindings' own calls).
    v2 = getattr(bindings, "CUDA_KERNEL_NODE_PARAMS_v2", None)
    why = "the bindings' kernel node parameters are not CUDA_KERNEL_NODE_PARAMS_v2"
    pointers = {}
    if v2 is not None and issubclass(bindings.CUDA_KERNEL_NODE_PARAMS, v2):
        version = bindings_major() * 1000
        for name, prototype in _PROTOTYPES.items():
            try:
                err, pfn, _ = bindings.cuGetProcAddress(name.encode(), version, 0)
            except Exception as exc:  # noqa: BLE001 - no driver, or another signature: the bindings' calls
                why = f"cuGetProcAddress({name}) failed: {exc}"
                break
            if err or not int(pfn):
                why = f"cuGetProcAddress({name}): {err}"
                break
            pointers[name] = prototype(int(pfn))
    if len(pointers) < len(_PROTOTYPES):
        if not _said:
            _said = True
            log.info("%s; frames let go of the GIL in their driver calls", why)
        return None
    return _wrap(pointers)


def _wrap(pointers: dict[str, Any]) -> dict[str, Callable[..., tuple[int]]]:
    set_params = pointers["cuGraphExecKernelNodeSetParams"]
    set_enabled = pointers["cuGraphNodeSetEnabled"]

    # Handles go in as ints (a bindings handle's ``int()`` is its value; None, a closed graph's, as
    # NULL, which the driver refuses as the bindings' call does), parameters by address.
    def held_set_params(exec_: Any, node: Any, params: Any) -> tuple[int]:
        return (set_params(int(exec_ or 0), int(node or 0), params.getPtr()),)

    def held_set_enabled(exec_: Any, node: Any, on: int) -> tuple[int]:
        return (set_enabled(int(exec_ or 0), int(node or 0), on),)

    held_set_params.raw = set_params  # type: ignore[attr-defined]  # (``RawCalls``)
    held_set_enabled.raw = set_enabled  # type: ignore[attr-defined]
    return {"cuGraphExecKernelNodeSetParams": held_set_params, "cuGraphNodeSetEnabled": held_set_enabled}
