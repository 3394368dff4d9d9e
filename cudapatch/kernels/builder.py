"""KernelBuilder: compiles kernel sources off the frame thread and loads their modules.

``submit(source)`` returns a ``Future[CompiledKernel]`` at once; a worker thread looks the source
up in the cubin cache (memory, then disk), compiles it on a miss (NVRTC / nvJitLink / Numba),
stores the cubin, and loads it into the engine's context, so the frame thread only swaps a ready
``CUfunction`` in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import KernelLoadError
from .cache import CubinCache
from .descriptor import KernelDescriptor
from .module_cache import ModuleCache
from .source import KernelImage, KernelSource

__all__ = ["CompiledKernel", "KernelBuilder"]

log = logging.getLogger("cudapatch.kernels")


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
            image = source.compile(self.arch)
            self.cache.put(key, image.image, {"symbol": image.symbol, "name": image.debug_name, "sha": image.key})
            origin = "compiled"
        function = self.modules.function(image)  # loads the module here, off the frame thread
        seconds = time.perf_counter() - t0
        log.debug("kernel %s ready (%s, %.1f ms)", source.debug_name, origin, seconds * 1e3)
        return CompiledKernel(source, image, function, origin, seconds)

    def close(self) -> None:
        """Finish queued work and stop the threads; idempotent."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def is_closed(self) -> bool:
        return self._closed
