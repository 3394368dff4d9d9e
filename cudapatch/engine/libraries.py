"""LibraryHandles: the engine's cuBLAS, cuFFT, cuRAND, cuSOLVER and cuSPARSE state, ready for capture.

Library calls reach the graph by stream capture (``engine/capture.py``), which fails or captures
memory-allocation nodes when a library initialises or allocates lazily. So, as measured on the
H100 (DESIGN.md §5):

- one cuBLAS handle per engine, in device pointer mode (``alpha``/``beta`` read from device memory
  at run time: changing them needs no re-capture), given a workspace before every capture
  (``cublasSetStream`` resets the workspace, so the order is stream, then workspace);
- cuFFT plans and cuRAND generators are created and initialised outside capture, in a call's
  ``prepare`` step, and cached;
- cuSOLVER and cuSPARSE handles per engine, their workspaces sized and reserved before capture.

Resources a captured call bakes into the graph (workspaces, plans, generators) belong to that
call's ``CallLibraryScope``: two calls running concurrently in the graph never share one. That class
implements the ``LibraryScope`` protocol call functions are typed against
(``cudapatch.blocks.libraries``, which blocks depend on instead of this module). CuPy's global
handles are never touched. nvmath-python's raw bindings are imported on first use, so an engine
without library blocks never loads them.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from .._lifecycle import HandleOwner
from ..blocks.libraries import nvmath_module
from ..errors import CudapatchError, LibraryCallError
from ..kernels._driver import check, driver
from ..kernels.types import DType
from .buffers import BufferPool, GpuBuffer
from .device import DeviceContext

__all__ = ["CallLibraryScope", "LibraryHandles", "library_error"]

log = logging.getLogger("cudapatch.engine")

_STATUS = re.compile(r"\b(CU[A-Z]+_STATUS_[A-Z_]+|CUFFT_[A-Z_]+|CURAND_STATUS_[A-Z_]+)\b")


def library_error(exc: BaseException, call: str, block: str | None) -> LibraryCallError:
    """A ``LibraryCallError`` for ``exc`` raised by (or inside) call ``call``, with the library's
    status name when the exception carries one."""
    if isinstance(exc, LibraryCallError):
        if exc.block is None:
            exc.block = block
        if exc.kernel is None:
            exc.kernel = call
        return exc
    text = str(exc) or type(exc).__name__
    m = _STATUS.search(text)
    status = m.group(1) if m else None
    if isinstance(exc, CudapatchError):
        text = exc.message
    return LibraryCallError(f"{type(exc).__name__}: {text}", status=status, block=block, kernel=call)


class CallLibraryScope:
    """The library resources of one captured call (one node of the graph): its workspaces, cuFFT
    plans and cuRAND generators, and the engine-wide handles.

    A call function gets its scope as ``libs``, typed as the ``LibraryScope`` protocol (whose
    docstrings are the plugin author's reference); see ``cudapatch.blocks.libraries``.
    """

    def __init__(self, handles: LibraryHandles, key: object) -> None:
        self._handles = handles
        self.key = key
        self._workspaces: dict[str, GpuBuffer] = {}
        self._plans: dict[tuple, int] = {}
        self._generators: dict[tuple, int] = {}

    @property
    def capture_stream_handle(self) -> int:
        """The capture stream as an integer (for ``prepare`` steps that query a library handle)."""
        return int(self._handles.capture_stream)

    @property
    def capturing(self) -> bool:
        """True while the call is being captured (no allocation or initialisation may happen)."""
        return self._handles.capturing

    # -- workspaces --------------------------------------------------------------------------------
    def workspace(self, name: str, nbytes: int) -> int:
        """Device address of this call's workspace ``name``, at least ``nbytes`` long (256-byte aligned).
        Reserve it in ``prepare``: a larger one replaces the old (given back to the engine's pool,
        whose reuse is ordered on the engine stream after the work still using it).

        Raises:
            CudaError: the allocation failed.
        """
        buf = self._workspaces.get(name)
        need = max(int(nbytes), 1)
        if buf is None or buf.capacity_bytes < need:
            if buf is not None:
                buf.close()
            buf = GpuBuffer(self._handles.pool, DType.UINT8, need, stream=self._handles.device.stream)
            self._workspaces[name] = buf
        return buf.ptr

    # -- handles -----------------------------------------------------------------------------------
    def cublas(self, stream: int) -> int:
        """The engine's cuBLAS handle bound to ``stream``, in device pointer mode, with this call's
        workspace set (so the capture holds no allocation)."""
        mod = nvmath_module("cublas")
        h = self._handles.cublas_handle()
        mod.set_stream(h, stream)  # resets the workspace to cuBLAS's own pool: set ours after it
        size = self._handles.cublas_workspace_bytes
        mod.set_workspace(h, self.workspace("cublas", size), size)
        return h

    def cusolver(self, stream: int) -> int:
        """The engine's cuSOLVER dense handle bound to ``stream``."""
        mod = nvmath_module("cusolverDn")
        h = self._handles.cusolver_handle()
        mod.set_stream(h, stream)
        return h

    def cusparse(self, stream: int) -> int:
        """The engine's cuSPARSE handle bound to ``stream``, in device pointer mode."""
        mod = nvmath_module("cusparse")
        h = self._handles.cusparse_handle()
        mod.set_stream(h, stream)
        return h

    def fft_plan(self, kind: str, shape: tuple[int, ...], batch: int, stream: int | None = None) -> int:
        """A cuFFT plan of ``kind`` (``C2C``, ``R2C``, ``C2R``, ``Z2Z``, ``D2Z``, ``Z2D``) for
        ``shape`` (1-D or 2-D, row-major) and ``batch``, cached per call. Created outside capture
        (in ``prepare``); inside capture only a cached plan may be asked for.

        Raises:
            LibraryCallError: a new plan was asked for during capture, or cuFFT refused the plan.
        """
        key = (kind, tuple(int(n) for n in shape), int(batch))
        plan = self._plans.get(key)
        if plan is None:
            if self.capturing:
                raise LibraryCallError(
                    f"cuFFT plan {kind} {list(shape)} x{batch} was not created before capture; "
                    "create it in the call's prepare step"
                )
            mod = nvmath_module("cufft")
            plan = mod.create()
            try:
                fft_type = getattr(mod.Type, kind)
                n = list(key[1])
                mod.make_plan_many(plan, len(n), n, 0, 1, 0, 0, 1, 0, fft_type, key[2])  # 0: packed layout
            except Exception:
                mod.destroy(plan)
                raise
            self._plans[key] = plan
        if stream is not None:
            nvmath_module("cufft").set_stream(plan, stream)
        return plan

    def generator(self, kind: str = "PSEUDO_DEFAULT", seed: int = 0, stream: int | None = None) -> int:
        """A cuRAND generator of ``kind`` (a ``curandRngType`` name) seeded with ``seed``, cached per
        call and initialised outside capture (its seed kernels cannot run inside one). Measured on
        the H100: a captured generate call yields new numbers on every graph launch.

        Raises:
            LibraryCallError: a new generator was asked for during capture.
        """
        key = (kind, int(seed))
        gen = self._generators.get(key)
        if gen is None:
            if self.capturing:
                raise LibraryCallError(
                    f"cuRAND generator {kind} (seed {seed}) was not created before capture; "
                    "create it in the call's prepare step"
                )
            mod = nvmath_module("curand")
            gen = mod.create_generator(getattr(mod.RngType, kind))
            try:
                mod.set_stream(gen, int(self._handles.device.stream_handle))
                mod.set_pseudo_random_generator_seed(gen, int(seed))
                mod.generate_seeds(gen)  # the initialisation kernels, on the engine stream, now
            except Exception:
                mod.destroy_generator(gen)
                raise
            self._generators[key] = gen
        if stream is not None:
            nvmath_module("curand").set_stream(gen, stream)
        return gen

    def close(self) -> None:
        """Free this call's plans, generators and workspaces; idempotent."""
        if self._plans:
            mod = nvmath_module("cufft")
            for plan in self._plans.values():
                mod.destroy(plan)
            self._plans.clear()
        if self._generators:
            mod = nvmath_module("curand")
            for gen in self._generators.values():
                mod.destroy_generator(gen)
            self._generators.clear()
        for buf in self._workspaces.values():
            buf.close()
        self._workspaces.clear()

    def __repr__(self) -> str:
        return (
            f"<CallLibraryScope {self.key} workspaces={len(self._workspaces)} plans={len(self._plans)} "
            f"generators={len(self._generators)}>"
        )


class LibraryHandles(HandleOwner):
    """The library state of one engine: handles, a capture stream and per-call scopes.

    Lifecycle (``cudapatch._lifecycle``): no finalizer; its engine closes it (``DeviceResources``), or
    abandons it after a lost context. Asking a closed one for a handle, scope or the capture stream
    raises ``CudapatchError``.

    Args:
        device: The engine's device (its context must be current when calls are made).
        pool: Where workspaces come from.
        cublas_workspace_bytes: Workspace per captured cuBLAS call (default: 32 MiB on Hopper and
            newer, 4 MiB before: NVIDIA's recommendation, so kernel choice matches eager calls).
    """

    def __init__(self, device: DeviceContext, pool: BufferPool, *, cublas_workspace_bytes: int | None = None) -> None:
        self.device = device
        self.pool = pool
        major = device.compute_capability[0]
        self.cublas_workspace_bytes = cublas_workspace_bytes or ((32 if major >= 9 else 4) << 20)
        self.capturing = False
        self._capture_stream: Any = None
        self._cublas: int | None = None
        self._cusolver: int | None = None
        self._cusparse: int | None = None
        self._scopes: dict[object, CallLibraryScope] = {}
        self._closed = False

    @property
    def capture_stream(self) -> Any:
        """The side stream captures run on (created on first use; non-blocking, so capture never
        orders against the legacy default stream).

        Raises:
            CudapatchError: the handles are closed.
            CudaError: stream creation failed.
        """
        self._check_open("LibraryHandles.capture_stream")
        if self._capture_stream is None:
            d = driver()
            flags = d.CUstream_flags.CU_STREAM_NON_BLOCKING.value
            self._capture_stream = check(d.cuStreamCreate(flags), "cuStreamCreate")
        return self._capture_stream

    def scope(self, key: object) -> CallLibraryScope:
        """The resources of captured call ``key`` (``(block id, kernel index)``), made on first use.

        Raises:
            CudapatchError: the handles are closed.
        """
        self._check_open("LibraryHandles.scope")
        s = self._scopes.get(key)
        if s is None:
            s = self._scopes[key] = CallLibraryScope(self, key)
        return s

    def cublas_handle(self) -> int:
        """The engine's cuBLAS handle (device pointer mode), created on first use."""
        self._check_open("LibraryHandles.cublas_handle")
        if self._cublas is None:
            mod = nvmath_module("cublas")
            h = mod.create()
            mod.set_pointer_mode(h, mod.PointerMode.DEVICE)
            self._cublas = h
        return self._cublas

    def cusolver_handle(self) -> int:
        """The engine's cuSOLVER dense handle, created on first use."""
        self._check_open("LibraryHandles.cusolver_handle")
        if self._cusolver is None:
            self._cusolver = nvmath_module("cusolverDn").create()
        return self._cusolver

    def cusparse_handle(self) -> int:
        """The engine's cuSPARSE handle (device pointer mode), created on first use."""
        self._check_open("LibraryHandles.cusparse_handle")
        if self._cusparse is None:
            mod = nvmath_module("cusparse")
            h = mod.create()
            mod.set_pointer_mode(h, mod.PointerMode.DEVICE)
            self._cusparse = h
        return self._cusparse

    def keep_only(self, keys: set[object]) -> None:
        """Free the scopes of calls no longer in any graph (call once no retired graph still runs)."""
        for key in [k for k in self._scopes if k not in keys]:
            self._scopes.pop(key).close()

    @property
    def scope_count(self) -> int:
        return len(self._scopes)

    def abandon(self) -> None:
        """Forget every handle without destroying it: the context was reset under them."""
        self._scopes.clear()
        self._cublas = self._cusolver = self._cusparse = None
        self._capture_stream = None
        self._closed = True

    def close(self) -> None:
        """Destroy every scope, handle and the capture stream; idempotent.

        Raises:
            CudaError: destroying the stream failed.
        """
        if self._closed:
            return
        self._closed = True
        self.keep_only(set())
        if self._cublas is not None:
            nvmath_module("cublas").destroy(self._cublas)
        if self._cusolver is not None:
            nvmath_module("cusolverDn").destroy(self._cusolver)
        if self._cusparse is not None:
            nvmath_module("cusparse").destroy(self._cusparse)
        self._cublas = self._cusolver = self._cusparse = None
        if self._capture_stream is not None:
            check(driver().cuStreamDestroy(self._capture_stream), "cuStreamDestroy")
            self._capture_stream = None

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<LibraryHandles scopes={len(self._scopes)} closed={self._closed}>"
