"""The compiler process: kernel sources compile in a spawned Python process shared by all engines.

Numba holds Python's GIL for tens of milliseconds while it compiles, which would stall the frame
thread, and a compiler crash must not take the host down; so compiles run elsewhere. The parent
talks to the child over one pipe and never waits on it in a thread of its own: whoever wants
results calls ``poll`` (the kernel builder does so between frames), so no hidden thread of the
host process wakes up to run Python when a result arrives.

``CUDAPATCH_COMPILE_PROCESSES=0`` turns the process off (hosts whose ``sys.executable`` is not a
Python interpreter, such as TouchDesigner, never use it).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import sys
import threading
import time
from typing import Any

from ..errors import KernelCompileError
from .source import KernelImage, KernelSource

__all__ = ["CompileJob", "CompilerProcess", "compiler_process", "processes_allowed"]

CRASHED = "the compiler process crashed on this kernel (the host is fine); edit the source to retry"


def _serve(conn: Any) -> None:
    """The child: compile each ``(job id, source, arch)`` received and send back the image or error."""
    if hasattr(os, "nice"):  # background work: where cores are short, frames (the host's threads) go first
        try:
            os.nice(10)
        except OSError:
            pass
    while True:
        try:
            job_id, source, arch = conn.recv()
        except (EOFError, OSError):  # the parent went away
            return
        try:
            reply: tuple = (job_id, source.compile(arch), None)
        except Exception as exc:  # every compiler error goes back to the parent, as it was raised
            reply = (job_id, None, exc)
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError):  # an error that does not pickle
            conn.send((job_id, None, KernelCompileError(f"{type(reply[2]).__name__}: {reply[2]}")))


class CompileJob:
    """One compile sent to the process: ``done`` once ``image`` or ``error`` is set (by ``poll``)."""

    __slots__ = ("source", "done", "image", "error")

    def __init__(self, source: KernelSource) -> None:
        self.source = source
        self.done = False
        self.image: KernelImage | None = None
        self.error: BaseException | None = None


class CompilerProcess:
    """A spawned compiler and the jobs sent to it. Thread-safe."""

    def __init__(self) -> None:
        # spawn, not fork: the parent holds a CUDA context, which a forked child must never touch.
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child,), name="cudapatch-compiler", daemon=True)
        self._proc.start()
        child.close()
        self._jobs: dict[int, CompileJob] = {}
        self._next_id = 0
        self._lock = threading.Lock()
        self.broken = False

    def send(self, source: KernelSource, arch: str) -> CompileJob:
        """Queue ``source`` for compilation; never waits for the compile."""
        job = CompileJob(source)
        with self._lock:
            if self.broken:
                job.error, job.done = KernelCompileError(CRASHED, kernel=source.debug_name), True
                return job
            self._next_id += 1
            try:
                self._conn.send((self._next_id, source, arch))
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                job.error, job.done = exc, True
                return job
            except OSError:
                self._crashed()
                job.error, job.done = KernelCompileError(CRASHED, kernel=source.debug_name), True
                return job
            self._jobs[self._next_id] = job
        return job

    def poll(self, timeout: float = 0.0) -> None:
        """Complete the jobs whose results arrived, waiting up to ``timeout`` seconds for the first."""
        with self._lock:
            try:
                while self._jobs and self._conn.poll(timeout):
                    job_id, image, error = self._conn.recv()
                    job = self._jobs.pop(job_id, None)
                    if job is not None:
                        job.image, job.error, job.done = image, error, True
                    timeout = 0.0
            except (EOFError, OSError):
                self._crashed()

    def wait(self, job: CompileJob, timeout: float | None = None) -> None:
        """Poll until ``job`` is done (or ``timeout`` passes)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not job.done and (end is None or time.monotonic() < end):
            self.poll(0.05)

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    def _crashed(self) -> None:
        # Lock held. Every job in flight fails: the child compiles one at a time, so the first was the
        # culprit, and the rest went down with it.
        self.broken = True
        for job in self._jobs.values():
            job.error, job.done = KernelCompileError(CRASHED, kernel=job.source.debug_name), True
        self._jobs.clear()
        self._conn.close()

    def close(self) -> None:
        """Stop the child; idempotent."""
        with self._lock:
            if not self.broken:
                self._crashed()
        self._proc.join(timeout=1.0)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=1.0)


_lock = threading.Lock()
_process: CompilerProcess | None = None


def processes_allowed() -> bool:
    """Whether compiles may run in a spawned process (``sys.executable`` is Python, not turned off)."""
    if os.environ.get("CUDAPATCH_COMPILE_PROCESSES", "1") == "0":
        return False
    exe = os.path.basename(sys.executable or "").lower()
    return exe.startswith("python") or exe.startswith("pypy")


def compiler_process() -> CompilerProcess | None:
    """The shared compiler process (spawned on first use, again after a crash; None where not allowed)."""
    global _process
    if not processes_allowed():
        return None
    with _lock:
        if _process is None or _process.broken:
            if _process is not None:
                _process.close()
            _process = CompilerProcess()
        return _process


@atexit.register
def _shutdown() -> None:
    if _process is not None:
        _process.close()
