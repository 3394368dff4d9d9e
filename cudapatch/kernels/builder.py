"""KernelBuilder: compiles kernel sources off the frame thread and loads their modules.

``submit(source)`` returns a ``Future[CompiledKernel]`` at once; a worker thread looks the source
up in the cubin cache (memory, then disk), compiles it on a miss, stores the cubin, and loads it
into the engine's context, so the frame thread only swaps a ready ``CUfunction`` in.

The compile itself runs in a spawned compiler process shared by all engines, for every source
that can be sent there (CUDA C++, PTX files, Numba functions importable by name): Numba holds
Python's GIL for tens of milliseconds while it compiles, which would stall the frame thread,
and a compiler crash must not take the host down. Other sources compile on the worker thread.
``CUDAPATCH_COMPILE_PROCESSES=0`` turns the process off (hosts whose ``sys.executable`` is not a
Python interpreter, such as TouchDesigner, never use it).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import KernelCompileError, KernelLoadError
from .cache import CubinCache
from .descriptor import KernelDescriptor
from .module_cache import ModuleCache
from .source import KernelImage, KernelSource

__all__ = ["CompiledKernel", "KernelBuilder"]

log = logging.getLogger("cudapatch.kernels")


_process_lock = threading.Lock()
_process_pool: ProcessPoolExecutor | None = None


def _compile_in_child(source: KernelSource, arch: str) -> KernelImage:
    return source.compile(arch)


def _child_ready() -> int:
    return os.getpid()


def _processes_allowed() -> bool:
    if os.environ.get("CUDAPATCH_COMPILE_PROCESSES", "1") == "0":
        return False
    exe = os.path.basename(sys.executable or "").lower()
    return exe.startswith("python") or exe.startswith("pypy")


def compiler_process() -> ProcessPoolExecutor | None:
    """The shared compiler process (spawned on first use; None where processes are not allowed)."""
    global _process_pool
    if not _processes_allowed():
        return None
    with _process_lock:
        if _process_pool is None:
            # spawn, not fork: the parent holds a CUDA context, which a forked child must never touch.
            _process_pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            _process_pool.submit(_child_ready)  # start the interpreter now, in the background
        return _process_pool


def _reset_process(broken: ProcessPoolExecutor) -> None:
    global _process_pool
    with _process_lock:
        if _process_pool is broken:
            _process_pool = None
    broken.shutdown(wait=False, cancel_futures=True)


@atexit.register
def _shutdown_process() -> None:
    if _process_pool is not None:
        _process_pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class CompiledKernel:
    """A kernel ready to launch: its cubin, the loaded ``CUfunction`` and how it was obtained."""

    source: KernelSource
    image: KernelImage
    function: Any
    origin: Literal["memory", "disk", "compiled"]
    seconds: float

    @property
    def descriptor(self) -> KernelDescriptor:
        return self.image.descriptor


class KernelBuilder:
    """Background compiler of one engine (one device architecture, one context).

    Args:
        arch: ``sm_XX`` of the device.
        cache: The cubin cache.
        modules: Where modules are loaded (thread-safe).
        make_current: Makes the engine's context current on the calling (worker) thread.
        workers: Compile threads.
    """

    def __init__(
        self,
        *,
        arch: str,
        cache: CubinCache,
        modules: ModuleCache,
        make_current: Callable[[], None],
        workers: int = 2,
    ) -> None:
        self.arch = arch
        self.cache = cache
        self.modules = modules
        self._make_current = make_current
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cudapatch-compile")
        self._local = threading.local()
        self._closed = False
        # Start the workers now: the pool creates threads on submit, and a thread start on the frame
        # thread (the first edit) costs more than the rest of that frame.
        for f in [self._pool.submit(self._bind_thread) for _ in range(workers)]:
            f.result()

    def _bind_thread(self) -> None:
        self._make_current()
        self._local.current = True

    def submit(self, source: KernelSource) -> Future[CompiledKernel]:
        """Queue ``source`` for compilation; never blocks.

        Raises:
            KernelLoadError: the builder is closed.
        """
        if self._closed:
            raise KernelLoadError("the kernel builder is closed", kernel=source.debug_name)
        return self._pool.submit(self.build, source)

    def build(self, source: KernelSource) -> CompiledKernel:
        """Compile (or fetch from the cache) and load ``source``, on the calling thread.

        Raises:
            KernelLoadError: the source cannot be read, compiled or loaded (with the compiler log).
        """
        t0 = time.perf_counter()
        if not getattr(self._local, "current", False):
            self._make_current()
            self._local.current = True
        key = source.cache_key(self.arch)
        hit = self.cache.get(key)
        origin: Literal["memory", "disk", "compiled"]
        if hit is not None:
            meta = hit.meta
            image = KernelImage(
                source.describe(),
                hit.payload,
                "cubin",
                meta.get("sha", key),
                meta.get("name", source.debug_name),
                symbol=meta.get("symbol", ""),
            )
            origin = hit.level
        else:
            image = self._compile(source)
            self.cache.put(key, image.image, {"symbol": image.symbol, "name": image.debug_name, "sha": image.key})
            origin = "compiled"
        function = self.modules.function(image)  # loads the module here, off the frame thread
        seconds = time.perf_counter() - t0
        log.debug("kernel %s ready (%s, %.1f ms)", source.debug_name, origin, seconds * 1e3)
        return CompiledKernel(source, image, function, origin, seconds)

    def _compile(self, source: KernelSource) -> KernelImage:
        pool = compiler_process() if source.portable else None
        if pool is None:
            return source.compile(self.arch)
        try:
            return pool.submit(_compile_in_child, source, self.arch).result()
        except BrokenProcessPool:
            _reset_process(pool)
            raise KernelCompileError(
                "the compiler process crashed on this kernel (the host is fine); edit the source to retry",
                kernel=source.debug_name,
            ) from None

    def close(self) -> None:
        """Finish queued work and stop the threads; idempotent."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def is_closed(self) -> bool:
        return self._closed
