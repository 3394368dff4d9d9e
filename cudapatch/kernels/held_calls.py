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
int: ``_driver.check`` names it as the driver does.

``cuGraphLaunch`` is not held: it waits when the GPU is behind and its launch queue is full, and a
frame loop faster than the GPU would then hold the GIL from every other thread nearly all the time
(a build would never land). It is one opening per frame, at its end.

Where the driver module is not the bindings' (a stand-in on a machine without a GPU), or a test
replaced one of its functions, or the driver does not give the entry point, the bindings' own
function is used.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from ._driver import bindings_major, driver

__all__ = ["FrameCalls", "frame_calls"]

log = logging.getLogger("cudapatch.kernels")

_VOID_P = ctypes.c_void_p
#: name -> the C prototype (all return ``CUresult``, an int)
_PROTOTYPES = {
    # (exec, node, params*)
    "cuGraphExecKernelNodeSetParams": ctypes.PYFUNCTYPE(ctypes.c_int, _VOID_P, _VOID_P, _VOID_P),
    "cuGraphNodeSetEnabled": ctypes.PYFUNCTYPE(ctypes.c_int, _VOID_P, _VOID_P, ctypes.c_uint),  # (exec, node, on)
}


class FrameCalls(NamedTuple):
    """The frame path's three driver calls, each shaped as the bindings' function of that name (the
    launch is always the driver module's own)."""

    launch: Callable[[Any, Any], tuple[Any]]
    set_params: Callable[[Any, Any, Any], tuple[Any]]
    set_enabled: Callable[[Any, Any, int], tuple[Any]]


def frame_calls() -> FrameCalls:
    """The driver calls for a graph's frame path: held ones where the driver is the bindings' own and
    the function was not replaced, else the driver module's functions."""
    d = driver()
    held = _held_calls(d)

    def pick(name: str) -> Callable[..., Any]:
        current = getattr(d, name)
        fn = held.get(name)
        return fn if fn is not None and current is _originals.get(name) else current

    return FrameCalls(d.cuGraphLaunch, pick("cuGraphExecKernelNodeSetParams"), pick("cuGraphNodeSetEnabled"))


_held: dict[str, Callable[..., tuple[int]]] | None = None  # the held calls, resolved once (None: not yet)
_originals: dict[str, Any] = {}  # the bindings' functions they stand for
_bindings: Any = None  # ``cuda.bindings.driver``, once resolved


def _held_calls(d: Any) -> dict[str, Callable[..., tuple[int]]]:
    global _held, _bindings
    if _held is None:
        try:
            from cuda.bindings import driver as bindings
        except ImportError:  # pragma: no cover - no bindings, no GPU
            return {}
        if d is not bindings:  # a stand-in driver: its own functions (resolved once the real one is used)
            return {}
        _bindings, _held = bindings, _resolve(bindings)
    return _held if d is _bindings else {}


def _resolve(bindings: Any) -> dict[str, Callable[..., tuple[int]]]:
    version = bindings_major() * 1000  # the entry points of the bindings' CUDA version: their structs
    pointers = {}
    for name, prototype in _PROTOTYPES.items():
        _originals[name] = getattr(bindings, name)
        try:
            err, pfn, _ = bindings.cuGetProcAddress(name.encode(), version, 0)
        except Exception as exc:  # noqa: BLE001 - no driver, or another signature: the bindings' calls
            log.debug("cuGetProcAddress(%s) failed: %s; frames release the GIL in it", name, exc)
            return {}
        if err or not int(pfn):
            log.debug("cuGetProcAddress(%s): %s; frames release the GIL in it", name, err)
            return {}
        pointers[name] = prototype(int(pfn))
    return _wrap(pointers)


def _wrap(pointers: dict[str, Any]) -> dict[str, Callable[..., tuple[int]]]:
    set_params = pointers["cuGraphExecKernelNodeSetParams"]
    set_enabled = pointers["cuGraphNodeSetEnabled"]

    # (handles go in as ints: a bindings handle's ``int()`` is its value; parameters by address)
    def held_set_params(exec_: Any, node: Any, params: Any) -> tuple[int]:
        return (set_params(int(exec_), int(node), params.getPtr()),)

    def held_set_enabled(exec_: Any, node: Any, on: int) -> tuple[int]:
        return (set_enabled(int(exec_), int(node), on),)

    return {"cuGraphExecKernelNodeSetParams": held_set_params, "cuGraphNodeSetEnabled": held_set_enabled}
