"""Surviving a sticky GPU fault (illegal address and the like) without losing the host process.

After such a fault every call on the CUDA context fails. ``recover`` first finds the faulting block
(unless ``debug_launch`` already named it) by replaying the patch block by block in a child process
(``engine.replay``), and puts it in ``engine._faulted``: builds leave its kernels out and zero-fill
its outputs, its dependents are warned, and the error stays on it until its code changes. Then it
forgets everything the dead context owned without touching it, resets the primary context and
reloads every compiled kernel from its cubin. Where the driver refuses the reset (H100 + driver 580
does), the engine is marked lost instead: it stops launching and says the process must restart.

External inputs die with the context (their memory was in it): they are unbound, with a warning
asking the host to bind them again.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from ..errors import CudaError, CudapatchError
from ..kernels.module_cache import ModuleCache
from .buffers import BufferPool
from .diagnostics import Diagnostic
from .libraries import LibraryHandles
from .replay import attribute_in_child

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["recover", "abandon_context_state"]

log = logging.getLogger("cudapatch.engine")


def abandon_context_state(engine: Engine) -> None:
    """Forget every object the dead context owned (graphs, buffers, engine-owned uploads) without
    a driver call: each would fail now."""
    for g in (engine._graph, *engine._retired):
        if g is not None:
            g.abandon()
    engine._graph, engine._retired = None, []
    engine.libraries.abandon()
    engine.pool.abandon()
    engine._owned.clear()
    engine._stamp_function = engine._publish_function = None


def _fresh_context(engine: Engine) -> None:
    """Forget the dead context's objects, reset it, and give the engine new pool and modules."""
    abandon_context_state(engine)
    engine.device.reset()
    engine._stream = engine.device.stream
    engine.pool = BufferPool(engine.device.make_current)
    engine.libraries = LibraryHandles(engine.device, engine.pool)
    engine.modules = ModuleCache(device_key=engine.device.key)
    engine.kernels.builder.modules = engine.modules
    for slot in engine.kernels._slots.values():  # cubins survive; their loaded functions do not
        if slot.good is not None:
            try:
                slot.good = dataclasses.replace(slot.good, function=engine.modules.function(slot.good.image))
            except CudapatchError as exc:
                slot.good, slot.error = None, exc


def recover(engine: Engine, exc: CudaError, culprit: int | None = None) -> int | None:
    """Survive a sticky fault: find the faulting block (unless given), disable it, and try to reset
    the context and rebuild. Where the driver keeps the fault for the rest of the process (it does on
    H100 + driver 580), the engine is marked lost instead: it stops launching, the host process
    keeps running, and its diagnostics say which block faulted and that the engine's process must be
    restarted to use the GPU again.

    Returns:
        The faulting block's id, or None when it could not be found.
    """
    engine.counters.faults += 1
    log.error("GPU fault: %s; resetting the CUDA context and finding the block", exc)
    registry = engine.context.registry
    detail = "named by debug_launch"
    if culprit is None:
        # Before touching anything: the snapshot is pure data, and the child has a fresh context.
        snap = engine.context.snapshot()
        directory = engine.kernel_cache.directory
        culprit, detail = attribute_in_child(
            snap, device=engine.device.ordinal, cache_dir=False if directory is None else str(directory)
        )
    what = ""
    if culprit is not None:
        block = registry.get(culprit)
        name = block.name if block is not None else str(culprit)
        kernels = ", ".join(k.descriptor.entry_point for k in block.description.kernels) if block else "?"
        what = f"{exc.name} in block '{name}' (kernel {kernels})"
        engine._faulted[culprit] = f"{what}: the block is disabled and its outputs read as zeros until its code changes"
    else:
        log.warning("the faulting block was not found (%s)", detail)
    bindings = dict(engine.context.bindings)
    try:
        _fresh_context(engine)
    except CudaError as reset_error:
        if culprit is not None:
            engine._faulted[culprit] = f"{what}: this block's kernel faulted on the GPU"
        where = f"block '{registry.get(culprit).name}'" if culprit is not None and registry.get(culprit) else "a block"
        engine._lost = (
            f"the GPU context is lost after {exc.name} in {where}; CUDA refuses to continue in this process "
            f"({reset_error.name} on reset): restart the engine's process"
        )
        engine._fault_diags = (Diagnostic("error", None, "gpu-lost", engine._lost),)
        return culprit
    warnings = []
    for (bid, port), _ in bindings.items():
        block = registry.get(bid)
        if block is not None:
            engine.context.unbind_input(block, port)
            warnings.append(
                Diagnostic(
                    "warning",
                    bid,
                    "binding-lost",
                    f"input '{block.name}.{port}' lost its memory in the GPU fault; bind it again",
                )  # fmt: skip
            )
    engine._fault_diags = tuple(warnings)
    engine._dirty.mark_structure()
    return culprit
