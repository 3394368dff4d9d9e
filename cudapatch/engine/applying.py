"""EditApplier: the edit frame, what is dirty applied with the cheapest correct tiers, in order.

The tiers themselves live in ``tiers.py`` (Hot, Warm, Recapture, Code, Bypass) and ``structure.py``
(a structure edit: built on the build thread or here, swapped in at a frame boundary). This is the
order the engine asks them in, and the rules between them: Code first (it queues compiles), then
Structure (a build started now, or made now), then Bypass and Hot/Warm on the graph that runs now;
a bypass that a fused group or shared buffers cannot take, and a re-capture only a new graph can
hold, go round again through Structure.

The frame path reaches this only when something is dirty (``Engine.update``); ``wait_ready`` drives
it until every kernel of the patch compiled.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from ..kernels.pacing import FRAME_GUARD

if TYPE_CHECKING:
    from .build_thread import BuildWorker
    from .dirty import DirtyTracker
    from .kernels import KernelTracker
    from .profiling import ProfilingLevel
    from .resources import DeviceResources
    from .structure import StructureTier
    from .tiers import BypassTier, CodeTier, ParamTier

__all__ = ["EditApplier", "EditSettings", "settle_compiles"]


class EditSettings(Protocol):
    """The engine's settings the edit frame reads each time (a host may change them between frames)."""

    profiling: ProfilingLevel
    wait_for_compile: bool
    background_builds: bool


def settle_compiles(code: CodeTier, kernels: KernelTracker, timeout: float | None = None) -> None:
    """Wait for the compiles in flight and apply what they bring (a build that must have every kernel)."""
    code.settle_fused(timeout)  # kernels of fused groups a member's edit regenerated
    code.apply(kernels.collect(wait=True, timeout=timeout))


class EditApplier:
    """Applies an engine's pending edits through its tiers (see the module docstring).

    Args:
        settings: The engine's live settings (``profiling``, ``wait_for_compile``, ``background_builds``).
        dirty: What changed since the last frame.
        resources: The running graph's owner.
        kernels: The kernel compiles.
        code, params, bypass: The tiers that update the running graph in place.
        structure: Where a structure edit builds, and its swap.
        worker: The build thread.
        graph_lock: The engine's lock around its executable graph (``wait_ready`` holds it).
    """

    def __init__(
        self,
        *,
        settings: EditSettings,
        dirty: DirtyTracker,
        resources: DeviceResources,
        kernels: KernelTracker,
        code: CodeTier,
        params: ParamTier,
        bypass: BypassTier,
        structure: StructureTier,
        worker: BuildWorker,
        graph_lock: threading.Lock,
    ) -> None:
        self._settings = settings
        self._dirty = dirty
        self._resources = resources
        self._kernels = kernels
        self._code = code
        self._params = params
        self._bypass = bypass
        self._structure = structure
        self._worker = worker
        self._graph_lock = graph_lock

    @property
    def off_thread(self) -> bool:
        """Whether structure edits build on the build thread now."""
        return self._settings.background_builds and not self._settings.wait_for_compile

    def apply(self) -> None:
        """Apply what is dirty, most expensive tier first: Code (queue compiles), Structure (start a
        build, or build now: ``structure.py``), then Bypass and Hot/Warm on the graph that runs now.

        Raises:
            CudaLaunchError: a fault of an earlier frame surfaced in an update call.
            CudaError: a driver call failed while building here.
        """
        structure, dirty, settings = self._structure, self._dirty, self._settings
        # A build about to start closes the idle retired graphs on its own thread.
        off_thread = self.off_thread
        structure.reap(graphs=not (dirty.structure and off_thread), off_thread=off_thread)
        if dirty.code:
            self._code.submit(dirty.take_code())
            if settings.wait_for_compile:
                settle_compiles(self._code, self._kernels)
        if dirty.structure:  # with a build in flight, the edit waits and coalesces into the next one
            here = settings.wait_for_compile or not settings.background_builds
            if structure.apply(settings.profiling, here=here, wait_for_compile=settings.wait_for_compile):
                return
            if self._worker.busy and not FRAME_GUARD.owner:  # started now: the rest of this frame first
                FRAME_GUARD.enter()  # (``update`` lets go of it)
        dirty.forget_code_and_captured()
        g = self._resources.graph
        if dirty.bypass:
            self._bypass.apply(g)  # no graph yet: the build applies the flags to the graph it makes
            if dirty.structure:  # the graph that takes it out of a fused group (or shared buffers) first
                self.apply()
                return
        if g is None:
            self._params.carry(*dirty.take_params())  # nothing runs yet: the build in flight gets them
        elif (dirty.params or dirty.bindings) and self._params.apply(g) and not structure.building:
            self.apply()  # a re-capture only a new graph can hold

    def wait_ready(self, timeout: float | None) -> None:
        """Build until every kernel of the patch compiled (or failed); see ``Engine.wait_ready``.

        Raises:
            CudaError: a driver call failed while building.
        """
        settings = self._settings
        waiting, settings.wait_for_compile = settings.wait_for_compile, True  # one build, every kernel in it
        try:
            with self._graph_lock:
                if self._worker.busy:  # the build in flight first: its outcome is applied, then built anew
                    self._worker.wait()
                    self._structure.finish()
                while True:
                    settle_compiles(self._code, self._kernels, timeout)
                    if self._dirty.any:
                        self.apply()
                    if not self._kernels.pending:
                        return
        finally:
            settings.wait_for_compile = waiting
