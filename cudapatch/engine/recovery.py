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

Recovery works only through the public operations of the objects it is handed.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..errors import CudaError
from .replay import ReplayStandby, attribute_in_child

if TYPE_CHECKING:
    from pathlib import Path

    from .board import DiagnosticBoard
    from .context import Context
    from .faults import FaultState
    from .kernels import KernelTracker
    from .resources import DeviceResources
    from .stats import EngineCounters

__all__ = ["Recovery"]

log = logging.getLogger("cudapatch.engine")


class Recovery:
    """Fault recovery for one engine.

    Args:
        context: The patch (snapshot for the replay; external inputs are unbound from it).
        resources: What the context owns; reset here.
        kernels: Reloads its compiled kernels into the new context.
        faults: Takes the disabled block, the lost inputs or the lost context.
        board: Republishes: no graph runs until the rebuild.
        counters: ``faults`` is counted here.
        cache_dir: The compiled-kernel cache directory for the replay process (None: memory only).
    """

    def __init__(
        self,
        *,
        context: Context,
        resources: DeviceResources,
        kernels: KernelTracker,
        faults: FaultState,
        board: DiagnosticBoard,
        counters: EngineCounters,
        cache_dir: Path | None,
    ) -> None:
        self._context = context
        self._resources = resources
        self._kernels = kernels
        self._faults = faults
        self._board = board
        self._counters = counters
        self._cache_dir: str | bool = False if cache_dir is None else str(cache_dir)
        #: A replay process started ahead (``Engine.prepare_fault_replay``); used by the next fault.
        self.replay_standby: ReplayStandby | None = None
        #: Whether a fault tries to reset the context (the engine goes on in this process if the
        #: driver allows it; H100 + driver 580 refuses, after about 0.1 s). False: the engine is
        #: lost at once (a process that is replaced after a fault: the isolated engine's child).
        self.reset_context = True
        #: The last fault's steps as ``time.monotonic()`` stamps: ``surfaced`` (recovery began), the
        #: replay's (``attribute_in_child``), ``named`` (the faulting block found), ``reset`` (the
        #: context reset, or refused). Empty before.
        self.times: dict[str, float] = {}

    def close(self) -> None:
        """End the replay process started ahead, if any."""
        standby, self.replay_standby = self.replay_standby, None
        if standby is not None:
            standby.close()

    def recover(self, exc: CudaError, culprit: int | None = None) -> int | None:
        """Survive a sticky fault: find the faulting block (unless given), disable it, and try to
        reset the context (the next build rebuilds the graph). Where the driver keeps the fault for
        the rest of the process (it does on H100 + driver 580), the engine is marked lost instead
        (``FaultState.lost``): it stops launching, the host process keeps running, and its
        diagnostics say which block faulted and that the engine's process must be restarted to use
        the GPU again.

        Args:
            exc: The fault as it surfaced.
            culprit: The faulting block when already known (``debug_launch``), else None.

        Returns:
            The faulting block's id, or None when it could not be found.
        """
        self._counters.faults += 1
        self.times = {"surfaced": time.monotonic()}
        log.error("GPU fault: %s; finding the block", exc)
        culprit, what = self._find(exc, culprit)
        self.times["named"] = time.monotonic()
        if culprit is not None:
            self._faults.disable(
                culprit, f"{what}: the block is disabled and its outputs read as zeros until its code changes"
            )
        refused = "a reset was not tried"
        if self.reset_context:
            bound = list(self._context.bindings)
            try:
                self._resources.reset()
                self._kernels.reload(self._resources.modules)
                self._resources.want_copy_kernels(self._kernels.builder)  # (the old context's went with it)
            except CudaError as reset_error:
                refused = f"{reset_error.name} on reset"
            else:
                refused = ""
                self._unbind(bound)
        if refused:
            if culprit is not None:
                self._faults.disable(culprit, f"{what}: this block's kernel faulted on the GPU")
            block = self._context.registry.get(culprit) if culprit is not None else None
            where = f"block '{block.name}'" if block is not None else "a block"
            self._faults.mark_lost(
                f"the GPU context is lost after {exc.name} in {where}; CUDA refuses to continue in this process "
                f"({refused}): restart the engine's process"
            )
        self.times["reset"] = time.monotonic()
        self._board.graph_gone()
        return culprit

    def _find(self, exc: CudaError, culprit: int | None) -> tuple[int | None, str]:
        """The faulting block (replayed in a child process unless known) and how to name the fault."""
        detail = "named by debug_launch"
        if culprit is None:
            # Before touching anything: the snapshot is pure data, and the child has a fresh context.
            device = self._resources.device.ordinal
            standby, self.replay_standby = self.replay_standby, None
            culprit, detail = attribute_in_child(
                self._context.snapshot(), device=device, cache_dir=self._cache_dir, standby=standby, times=self.times
            )
        if culprit is None:
            log.warning("the faulting block was not found (%s)", detail)
            return None, ""
        block = self._context.registry.get(culprit)
        name = block.name if block is not None else str(culprit)
        entries = ", ".join(k.descriptor.entry_point for k in block.description.kernels) if block else "?"
        return culprit, f"{exc.name} in block '{name}' (kernel {entries})"

    def _unbind(self, bound: list[tuple[int, str]]) -> None:
        """External inputs died with the context: unbind them, each warned until bound again."""
        registry, lost = self._context.registry, []
        for bid, port in bound:
            b = registry.get(bid)
            if b is not None:
                self._context.unbind_input(b, port)
                lost.append((bid, port, f"{b.name}.{port}"))
        self._faults.inputs_lost(lost)
        self._context.dirty.mark_structure()
