"""Surviving a sticky GPU fault (illegal address and the like) without losing the host process.

After such a fault every call on the CUDA context fails. ``recover`` first finds the faulting block
(unless ``debug_launch`` already named it) by replaying the patch block by block in a child process
(``engine.replay``), and disables it in the engine's ``FaultState``: builds leave its kernels out
and zero-fill its outputs, its dependents are warned, and the error stays on it until its code
changes. Then ``DeviceResources.reset`` forgets everything the dead context owned without touching
it, resets the primary context and makes the engine's stream, pool, library handles and module
cache anew, and the ``KernelTracker`` reloads every compiled kernel from its cubin. Where the
driver refuses the reset (H100 + driver 580 does), the engine is marked lost instead: it stops
launching and says the process must restart.

External inputs die with the context (their memory was in it): they are unbound, with a warning
asking the host to bind them again.

Recovery works only through the public operations of the objects it is handed; the engine then
republishes its diagnostics and rebuilds.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import CudaError
from .replay import attribute_in_child

if TYPE_CHECKING:
    from .context import Context
    from .faults import FaultState
    from .kernels import KernelTracker
    from .resources import DeviceResources

__all__ = ["recover"]

log = logging.getLogger("cudapatch.engine")


def recover(
    exc: CudaError,
    *,
    culprit: int | None,
    context: Context,
    resources: DeviceResources,
    kernels: KernelTracker,
    faults: FaultState,
    cache_dir: str | bool,
) -> int | None:
    """Survive a sticky fault: find the faulting block (unless given), disable it, and try to reset
    the context. Where the driver keeps the fault for the rest of the process (it does on H100 +
    driver 580), the engine is marked lost instead (``faults.lost``): it stops launching, the host
    process keeps running, and its diagnostics say which block faulted and that the engine's process
    must be restarted to use the GPU again.

    Args:
        exc: The fault as it surfaced.
        culprit: The faulting block when already known (``debug_launch``), else None.
        context: The patch (snapshot for the replay; external inputs are unbound from it).
        resources: What the context owns; reset here.
        kernels: Reloads its compiled kernels into the new context.
        faults: Takes the disabled block, the lost inputs or the lost context.
        cache_dir: The compiled-kernel cache directory for the replay process (False: none).

    Returns:
        The faulting block's id, or None when it could not be found.
    """
    log.error("GPU fault: %s; resetting the CUDA context and finding the block", exc)
    registry = context.registry
    detail = "named by debug_launch"
    if culprit is None:
        # Before touching anything: the snapshot is pure data, and the child has a fresh context.
        culprit, detail = attribute_in_child(context.snapshot(), device=resources.device.ordinal, cache_dir=cache_dir)
    block = registry.get(culprit) if culprit is not None else None
    what = ""
    if culprit is not None:
        name = block.name if block is not None else str(culprit)
        entries = ", ".join(k.descriptor.entry_point for k in block.description.kernels) if block else "?"
        what = f"{exc.name} in block '{name}' (kernel {entries})"
        faults.disable(culprit, f"{what}: the block is disabled and its outputs read as zeros until its code changes")
    else:
        log.warning("the faulting block was not found (%s)", detail)
    bound = list(context.bindings)
    try:
        resources.reset()
        kernels.reload(resources.modules)
    except CudaError as reset_error:
        if culprit is not None:
            faults.disable(culprit, f"{what}: this block's kernel faulted on the GPU")
        where = f"block '{block.name}'" if block is not None else "a block"
        faults.mark_lost(
            f"the GPU context is lost after {exc.name} in {where}; CUDA refuses to continue in this process "
            f"({reset_error.name} on reset): restart the engine's process"
        )
        return culprit
    lost = []
    for bid, port in bound:
        b = registry.get(bid)
        if b is not None:
            context.unbind_input(b, port)
            lost.append((bid, port, f"{b.name}.{port}"))
    faults.inputs_lost(lost)
    context.dirty.mark_structure()
    return culprit
