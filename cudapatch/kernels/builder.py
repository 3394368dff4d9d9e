"""KernelBuilder: compiles kernel sources off the frame thread and loads their modules.

``submit(source)`` returns a ``Future[CompiledKernel]`` at once. One service thread looks the
source up in the cubin cache (memory, then disk), sends it to the compiler process on a miss
(``compiler_process.py``, a child program that never imports the user's ``__main__``; sources that
cannot go there compile on the service thread), stores the cubin, and loads it into the engine's
context, so the frame thread only swaps a ready ``CUfunction`` in; the engine even does that swap
from the service thread, between frames. A compiler crash fails only the kernel it was compiling,
with the reason; the next compile starts a new compiler process.

An engine's builder is *paced*: the service thread does its Python only after a frame ends (see
``pacing.FrameGate``), or after ``idle_s`` without frames, and starts new requests for at most
``STEP_BUDGET_S`` after that (the rest wait for the next frame's end). ``unpaced()`` lifts that for
callers that wait for compiles (``Engine.wait_ready``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import KernelCompileError, KernelLoadError
from .cache import CubinCache
from .compiler_process import CompileJob, CompilerProcess, compiler_process
from .descriptor import KernelDescriptor
from .module_cache import ModuleCache
from .pacing import FrameGate
from .source import KernelImage, KernelSource

__all__ = ["CompiledKernel", "KernelBuilder"]

log = logging.getLogger("cudapatch.kernels")

#: How long a paced step starts new requests for after the frame that woke it (seconds). A request's
#: Python holds the interpreter in long C calls a frame cannot interrupt: a fused group of 500 blocks
#: renders its source (a 2-3 ms ``str.join``) and pickles it for the compiler process (a 4 ms
#: ``pickle.dumps``). Twenty such requests taken in one step ran into the next frames, and one waited
#: 4 ms for the interpreter (H100 host, a fused 10,000-block chain, nothing cached). Started within
#: this much of a frame's end, a request's Python is over well before the next frame at 60 fps.
STEP_BUDGET_S = 0.004


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


class _Request:
    """A submitted source on its way through the service thread."""

    __slots__ = ("source", "future", "started", "process", "job", "key")

    def __init__(self, source: KernelSource, future: Future) -> None:
        self.source = source
        self.future = future
        self.started = 0.0
        self.key = ""  # its cache key, worked out once (``_start``)
        self.process: CompilerProcess | None = None
        self.job: CompileJob | None = None


class KernelBuilder:
    """Background compiler of one engine (one device architecture, one context).

    Args:
        arch: ``sm_XX`` of the device.
        cache: The cubin cache.
        modules: Where modules are loaded (thread-safe).
        make_current: Makes the engine's context current on the calling (service) thread.
        paced: Do the service thread's work only after ``gate`` opens (the engine opens it after each
            frame) or after ``idle_s`` seconds without a frame. Unpaced, work starts at once.
        idle_s: How long a paced builder with work waits for a frame.
    """

    def __init__(
        self,
        *,
        arch: str,
        cache: CubinCache,
        modules: ModuleCache,
        make_current: Callable[[], None],
        paced: bool = False,
        idle_s: float = 0.1,
    ) -> None:
        self.arch = arch
        self.cache = cache
        self.modules = modules
        self._make_current = make_current
        self.paced = paced
        self.idle_s = idle_s
        #: Opened by the engine after a frame while ``gate.wanted``; see ``pacing``.
        self.gate = FrameGate()
        self._queue: deque[_Request] = deque()  # appended by any thread, taken by the service thread
        self._waiting: list[_Request] = []  # in the compiler process
        self._unpaced = 0
        self._closed = False
        self._current = False
        self._thread = threading.Thread(target=self._serve, name="cudapatch-compile", daemon=True)
        self._thread.start()

    # -- requests ----------------------------------------------------------------------------------
    def submit(self, source: KernelSource) -> Future[CompiledKernel]:
        """Queue ``source`` for compilation; never blocks. The future completes on the service thread
        (its callbacks run there).

        Raises:
            KernelLoadError: the builder is closed.
        """
        if self._closed:
            raise KernelLoadError("the kernel builder is closed", kernel=source.debug_name)
        fut: Future[CompiledKernel] = Future()
        self._queue.append(_Request(source, fut))
        if self.paced and not self._unpaced:
            self.gate.wanted = True  # the engine wakes the service thread once this frame is done
        else:
            self.gate.open()
        return fut

    @contextmanager
    def unpaced(self) -> Iterator[None]:
        """Work without waiting for frames inside this block (for callers that wait for results)."""
        self._unpaced += 1
        self.gate.open()
        try:
            yield
        finally:
            self._unpaced -= 1

    # -- the service thread --------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._closed:
            busy = bool(self._queue or self._waiting)
            by_frame = True  # the step below follows a frame's end (``STEP_BUDGET_S`` applies)
            if self._unpaced or not self.paced:
                # Unpaced: wake for submits at once, and look for compiler results every millisecond.
                self.gate.wait(0.001 if self._waiting else -1)
            elif busy:
                self.gate.wanted = True
                by_frame = self.gate.wait(self.idle_s)  # False: no frame came, none to keep clear of
            else:
                self.gate.wait(-1)  # submit() asks for the next frame; that frame opens the gate
            if self._closed:
                break
            try:
                self._step(by_frame)
            except Exception:  # never let the service thread die: every request must complete
                log.exception("kernel builder step failed")
        self._fail_all(KernelLoadError("the kernel builder closed before this kernel was built"))

    def _step(self, by_frame: bool = True) -> None:
        if not self._current:
            self._make_current()
            self._current = True
        queue = self._queue
        budget = self.paced and not self._unpaced and by_frame
        t0 = time.perf_counter()
        while queue:
            req = queue.popleft()
            if req.future.set_running_or_notify_cancel():
                self._start(req)
            if budget and time.perf_counter() - t0 > STEP_BUDGET_S:
                break  # the rest after the next frame (``_serve`` asks for it: the queue is not empty)
        if self._waiting:
            pending = []
            for process in {id(r.process): r.process for r in self._waiting}.values():
                assert process is not None
                process.poll()  # results that arrived; a crashed process fails its jobs here
            for req in self._waiting:
                job = req.job
                assert job is not None
                if not job.done:
                    pending.append(req)
                elif job.error is not None:
                    req.future.set_exception(self._compile_error(job.error, req.source))
                else:
                    assert job.image is not None
                    self._finish(req, job.image, "compiled")
            self._waiting = pending

    def _start(self, req: _Request) -> None:
        req.started = time.perf_counter()
        source = req.source
        try:
            key = req.key = source.cache_key(self.arch)
            hit = self._cached(source, key)
            if hit is not None:
                self._finish(req, *hit)
                return
            process = compiler_process() if source.portable else None
            if process is None:
                self._finish(req, source.compile(self.arch), "compiled")
                return
            req.process, req.job = process, process.send(source, self.arch)
            self._waiting.append(req)
        except Exception as exc:  # compile and load errors complete the future; nothing escapes
            req.future.set_exception(exc)

    def _finish(self, req: _Request, image: KernelImage, origin: Literal["memory", "disk", "compiled"]) -> None:
        try:
            if origin == "compiled":
                self._store(req.source, image, req.key)
            function = self.modules.function(image)  # loads the module here, off the frame thread
        except Exception as exc:
            req.future.set_exception(exc)
            return
        seconds = time.perf_counter() - req.started
        log.debug("kernel %s ready (%s, %.1f ms)", req.source.debug_name, origin, seconds * 1e3)
        req.future.set_result(CompiledKernel(req.source, image, function, origin, seconds))

    def _fail_all(self, exc: Exception) -> None:
        while self._queue:
            req = self._queue.popleft()
            if not req.future.cancel():
                req.future.set_exception(exc)
        for req in self._waiting:
            req.future.set_exception(exc)
        self._waiting = []

    # -- one source, on the calling thread -----------------------------------------------------------------
    def build(self, source: KernelSource) -> CompiledKernel:
        """Compile (or fetch from the cache) and load ``source``, on the calling thread.

        Raises:
            KernelLoadError: the source cannot be read, compiled or loaded (with the compiler log).
        """
        t0 = time.perf_counter()
        self._make_current()
        key = source.cache_key(self.arch)
        hit = self._cached(source, key)
        if hit is not None:
            image, origin = hit
        else:
            image, origin = self._compile(source), "compiled"
            self._store(source, image, key)
        function = self.modules.function(image)
        return CompiledKernel(source, image, function, origin, time.perf_counter() - t0)

    def build_cached(self, source: KernelSource) -> CompiledKernel | None:
        """``source`` loaded on the calling thread if it is in the memory or disk cache, else None (no
        compile is started). A build uses it so that a kernel compiled before runs in that build,
        without waiting for the next frame to wake the service thread.

        Raises:
            KernelLoadError: the cached image cannot be loaded.
        """
        t0 = time.perf_counter()
        hit = self._cached(source)
        if hit is None:
            return None
        image, origin = hit
        self._make_current()
        function = self.modules.function(image)
        return CompiledKernel(source, image, function, origin, time.perf_counter() - t0)

    def _cached(
        self, source: KernelSource, key: str | None = None
    ) -> tuple[KernelImage, Literal["memory", "disk"]] | None:
        if key is None:
            key = source.cache_key(self.arch)
        hit = self.cache.get(key)
        if hit is None:
            return None
        meta = hit.meta
        image = KernelImage(
            source.describe(),
            hit.payload,
            "cubin",
            meta.get("sha", key),
            meta.get("name", source.debug_name),
            symbol=meta.get("symbol", ""),
            jit_level=meta.get("jit_level"),
        )
        return image, hit.level

    def _store(self, source: KernelSource, image: KernelImage, key: str) -> None:
        """Keep ``image``, compiled from ``source``, under ``key``: the cache key worked out before the
        compile. A source read from files whose key is another one now changed while it compiled, so
        which version ``image`` holds is not known: it is not kept (the change compiles again)."""
        if source.watched_files():
            try:
                now = source.cache_key(self.arch)
            except KernelLoadError:  # gone or unreadable now: changed all the same
                now = None
            if now != key:
                log.debug("kernel %s changed while it compiled: its build is not cached", source.debug_name)
                return
        meta = {"symbol": image.symbol, "name": image.debug_name, "sha": image.key, "jit_level": image.jit_level}
        self.cache.put(key, image.image, meta, disk=source.disk_cached)

    def _compile(self, source: KernelSource) -> KernelImage:
        process = compiler_process() if source.portable else None
        if process is None:
            return source.compile(self.arch)
        job = process.send(source, self.arch)
        process.wait(job)
        if job.error is not None:
            raise self._compile_error(job.error, source)
        assert job.image is not None
        return job.image

    @staticmethod
    def _compile_error(error: BaseException, source: KernelSource) -> BaseException:
        if isinstance(error, Exception) and not isinstance(error, KernelLoadError):
            return KernelCompileError(f"{type(error).__name__}: {error}", kernel=source.debug_name)
        return error

    def close(self) -> None:
        """Stop the service thread; requests not built yet fail with KernelLoadError. Idempotent."""
        if not self._closed:
            self._closed = True
            self.gate.open()
            if self._thread is not threading.current_thread():
                self._thread.join(timeout=5.0)

    @property
    def is_closed(self) -> bool:
        return self._closed
