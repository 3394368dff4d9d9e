"""The compiler process: kernel sources compile in a child Python process shared by all engines.

Numba holds Python's GIL for tens of milliseconds while it compiles, which would stall the frame
thread, and a compiler crash must not take the host down; so compiles run elsewhere. The child is
a program of its own (``_compiler_child.py``) started with ``subprocess.Popen``, not
``multiprocessing``: spawn re-imports the user's main module in the child, so a script without an
``if __name__ == "__main__":`` guard ran again there. It gets the parent's ``sys.path`` (where
cudapatch and the modules defining Numba kernels were found) and the environment (``PYTHONPATH``
included), runs at ``nice 10`` (below-normal priority on Windows) and exits when its stdin closes.

The parent talks to the child over its stdin and stdout and never waits on them in a thread of
its own: whoever wants results calls ``poll`` (the kernel builder does so between frames), so no
hidden thread of the host process wakes up to run Python when a result arrives. The child gets one
job at a time, once it has said it is ready (the rest wait here): neither side then blocks on a
full pipe while the other does too, and a crash is pinned on the job that caused it. A crash fails
that job with the reason (exit code or signal, the tail of the child's stderr), logs it, and the
next job starts a new child; jobs queued behind it are not lost. The host is never touched. A job
that runs longer than ``JOB_DEADLINE_S`` is treated the same way: the child is ended, the job fails
saying the compile took longer than the deadline, and the next job starts a new child (a compiler
that hangs, as NVRTC did reading a FIFO it took for a header, must not hold up every later kernel).

Which interpreter runs the child:

- ``set_compiler_python(path)`` or the ``CUDAPATCH_COMPILER_PYTHON`` environment variable, if set:
  a Python of the same version as the host (``major.minor``), with cudapatch's dependencies
  importable. Needed where ``sys.executable`` is not a Python: embedded hosts (TouchDesigner's is
  ``TouchDesigner.exe``) and frozen apps (PyInstaller and the like, ``sys.frozen``). A path that
  does not start, or a Python of another version, fails each compile with an error that says so.
  It gets the host's ``sys.path`` entries after its own, so it finds cudapatch where the host did.
- otherwise ``sys.executable``, when it is a Python (its name starts with ``python`` or ``pypy``)
  and the app is not frozen.
- otherwise none: compiles run on the kernel builder's thread in this process (logged once).

``CUDAPATCH_COMPILE_PROCESSES=0`` turns the process off (compiles run in the builder's thread).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import pickle
import sys
import threading
import time
from collections import deque

from ..errors import KernelCompileError
from ._child_pipe import ChildPipe, describe_exit
from ._compiler_child import PROTOCOL, encode_frame
from .source import KernelImage, KernelSource

__all__ = [
    "CompileJob",
    "CompilerProcess",
    "compiler_process",
    "compiler_python",
    "describe_exit",
    "processes_allowed",
    "set_compiler_python",
]

log = logging.getLogger("cudapatch.kernels")

ENV_PYTHON = "CUDAPATCH_COMPILER_PYTHON"
CRASHED = "the compiler process crashed on this kernel"
#: A compile still running after this many seconds ends the child and fails its job. Generous on
#: purpose: real kernels compile in well under a second and a large templated one in tens of seconds
#: (NVRTC at ``-O3`` on a slow, busy machine); only a compiler that hangs should ever reach it.
JOB_DEADLINE_S = 120.0
_STDERR_LINES = 8  # of the child's stderr, in a block's message

_explicit: str | None = None


def set_compiler_python(path: str | os.PathLike[str] | None) -> None:
    """Run the compiler child with this Python interpreter (None: back to the default choice).

    Overrides ``CUDAPATCH_COMPILER_PYTHON`` and ``sys.executable``; children started from now on
    use it. For embedded hosts and frozen apps, whose ``sys.executable`` is not a Python.

    Args:
        path: A Python executable of the host's ``major.minor`` version that can import cudapatch's
            dependencies (NVRTC, nvJitLink and, for Numba kernels, numba).
    """
    global _explicit
    _explicit = None if path is None else os.fspath(path)


def compiler_python() -> tuple[str, str] | None:
    """The interpreter for the compiler child and where that choice came from, or None if there is none."""
    if _explicit:
        return _explicit, "set_compiler_python()"
    env = os.environ.get(ENV_PYTHON, "")
    if env:
        return env, ENV_PYTHON
    if getattr(sys, "frozen", False):  # sys.executable is the app itself
        return None
    exe = sys.executable or ""
    if os.path.basename(exe).lower().startswith(("python", "pypy")):
        return exe, "sys.executable"
    return None


_told_no_python = False


def processes_allowed() -> bool:
    """Whether compiles may run in a compiler process (not turned off, and an interpreter is known)."""
    global _told_no_python
    if os.environ.get("CUDAPATCH_COMPILE_PROCESSES", "1") == "0":
        return False
    if compiler_python() is None:
        if not _told_no_python:
            _told_no_python = True
            log.info(
                "kernels compile in this process: sys.executable (%s) is not a Python interpreter; "
                "set %s to one to compile in a separate process",
                sys.executable,
                ENV_PYTHON,
            )
        return False
    return True


def _tail_lines(text: str) -> str:
    """The last lines of a stderr tail that say something (not faulthandler's module list and thread ids)."""
    noise = ("Extension modules:", "Current thread 0x", "  <no Python frame>")
    lines = [ln.rstrip()[:300] for ln in text.splitlines() if ln.strip() and not ln.startswith(noise)]
    return "\n".join(lines[-_STDERR_LINES:])


class CompileJob:
    """One compile sent to the process: ``done`` once ``image`` or ``error`` is set (by ``poll``)."""

    __slots__ = ("source", "done", "image", "error")

    def __init__(self, source: KernelSource) -> None:
        self.source = source
        self.done = False
        self.image: KernelImage | None = None
        self.error: BaseException | None = None

    def _fail(self, message: str, *, file: str | None = None) -> None:
        self.error, self.done = KernelCompileError(message, kernel=self.source.debug_name, file=file), True


class CompilerProcess:
    """The compiler child and the jobs sent to it; restarts the child after a crash or a job past its deadline.
    Thread-safe.

    The child starts with the first job, not here, so a process that is never used costs nothing.

    Args:
        job_deadline_s: How long one compile may run in the child before the child is ended and the
            job fails (checked whenever results are polled).
    """

    def __init__(self, *, job_deadline_s: float = JOB_DEADLINE_S) -> None:
        self._lock = threading.RLock()
        self._child: ChildPipe | None = None
        self._jobs: dict[int, CompileJob] = {}  # every job not done: waiting here or in the child
        self._queue: deque[tuple[int, bytes]] = deque()  # (job id, request frame) not sent yet
        self._sent: int | None = None  # the job the child is compiling
        self._sent_at = 0.0  # time.monotonic() when it was sent
        self._next_id = 0
        self._closed = False
        self.job_deadline_s = job_deadline_s
        #: How many children ended without being asked to (crashes and failed starts).
        self.crashes = 0
        #: How many jobs ran past ``job_deadline_s`` (each ended its child).
        self.overdue = 0

    # -- jobs ----------------------------------------------------------------------------------------
    def send(self, source: KernelSource, arch: str) -> CompileJob:
        """Queue ``source`` for compilation; never waits for the compile (a new child starts if none runs)."""
        job = CompileJob(source)
        try:
            payload = pickle.dumps(source, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            job.error, job.done = exc, True
            return job
        with self._lock:
            if self._closed:
                job._fail("the compiler process is closed")
                return job
            self._next_id += 1
            self._jobs[self._next_id] = job
            self._queue.append((self._next_id, encode_frame((self._next_id, payload, arch))))
            self._pump()
        return job

    def poll(self, timeout: float = 0.0) -> None:
        """Complete the jobs whose results arrived, waiting up to ``timeout`` seconds for the child."""
        with self._lock:
            child = self._child
            if child is None or not self._jobs:
                return
            self._take(child)
            if not timeout or self._child is not child or not self._jobs:
                return
        try:
            child.wait_readable(timeout)  # outside the lock: senders and other pollers go on
        except (OSError, ValueError, AttributeError):  # another thread closed this child (and its selector)
            return
        with self._lock:
            if self._child is child:
                self._take(child)

    def wait(self, job: CompileJob, timeout: float | None = None) -> None:
        """Poll until ``job`` is done (or ``timeout`` passes)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not job.done and (end is None or time.monotonic() < end):
            self.poll(0.05)

    def start(self) -> int | None:
        """Start the child now if none runs (otherwise the first job does); its pid, None if it cannot start.

        For callers that set up the child's process attributes (CPU affinity) before any compile.
        """
        with self._lock:
            if self._child is None and not self._closed:
                self._start()
            return self.child_pid

    @property
    def in_flight(self) -> int:
        """Jobs not done yet (in the child or waiting for it)."""
        return len(self._jobs)

    @property
    def child_pid(self) -> int | None:
        """The running child's process id (None before the first job and after a crash)."""
        child = self._child
        return None if child is None else child.pid

    @property
    def is_closed(self) -> bool:
        return self._closed

    # -- the child (lock held) -----------------------------------------------------------------------
    def _pump(self) -> None:
        """Hand the child the next job if it has none; start a child if there is none."""
        while self._sent is None and self._queue and not self._closed:
            if self._child is None and not self._start():
                return
            child = self._child
            assert child is not None
            if not child.ready:  # the first job goes once the child reads its stdin (see _take), so
                return  # neither side ever blocks on a full pipe while the other does too
            job_id, frame = self._queue.popleft()
            self._sent, self._sent_at = job_id, time.monotonic()
            try:
                child.write(frame)
            except OSError:  # it died (maybe before it read anything): find out why
                self._take(child)
                if self._child is child:
                    self._died(child)

    def _start(self) -> bool:
        chosen = compiler_python()
        if chosen is None:
            self._fail_pending("no Python interpreter for the compiler process: set " + ENV_PYTHON)
            return False
        python, origin = chosen
        try:
            self._child = ChildPipe(python, origin)
        except OSError as exc:
            self.crashes += 1
            self._fail_pending(
                f"cannot start the compiler process with {python!r} (from {origin}): {exc}; "
                f"point {ENV_PYTHON} at a Python {sys.version_info[0]}.{sys.version_info[1]} interpreter, "
                "or set CUDAPATCH_COMPILE_PROCESSES=0 to compile in this process"
            )
            return False
        log.debug("compiler process started: pid %d (%s, from %s)", self._child.pid, python, origin)
        return True

    def _take(self, child: ChildPipe) -> None:
        """Read what ``child`` sent: complete jobs, hand it the next one; notice its end."""
        for payload in child.read():
            try:
                message = pickle.loads(payload)
            except Exception as exc:  # a frame that does not load: the stream cannot be trusted any more
                child.kill(f"a reply from it does not load: {type(exc).__name__}: {exc}")
                break
            if message[0] == "ready":
                self._handshake(child, message)
                if self._child is not child:
                    return
            else:
                self._complete(*message)
        if child.eof:
            self._died(child)
        elif self._sent is not None and time.monotonic() - self._sent_at > self.job_deadline_s:
            self._overdue(child)
        else:
            self._pump()

    def _handshake(self, child: ChildPipe, message: tuple) -> None:
        _, protocol, version, pid = message
        ours = tuple(sys.version_info[:2])
        if protocol == PROTOCOL and tuple(version) == ours:
            child.ready = True
            return
        why = (
            f"the compiler process ({child.python}, from {child.origin}) runs Python {version[0]}.{version[1]} "
            f"with protocol {protocol}; this host runs Python {ours[0]}.{ours[1]} with protocol {PROTOCOL}: "
            f"point {ENV_PYTHON} at a Python {ours[0]}.{ours[1]} with the same cudapatch"
        )
        log.error("%s", why)
        self.crashes += 1
        self._child = None
        child.close()
        self._fail_pending(why)

    def _complete(self, job_id: int, payload: bytes) -> None:
        if job_id == self._sent:
            self._sent = None
        job = self._jobs.pop(job_id, None)
        if job is None:
            return
        try:
            image, job.error = pickle.loads(payload)
            if image is not None and image.descriptor is None:  # its source's own (``_compiler_child``)
                image = dataclasses.replace(image, descriptor=job.source.describe())
            job.image = image
        except Exception as exc:  # e.g. an exception class whose constructor pickle cannot call
            job.error = KernelCompileError(
                f"the compiler's result does not load here: {type(exc).__name__}: {exc}", kernel=job.source.debug_name
            )
        job.done = True

    def _died(self, child: ChildPipe) -> None:
        """``child``'s output ended: fail the job it had (or, before it was ready, every job) with why."""
        how = child.finish()
        self._child = None
        self.crashes += 1
        tail = child.stderr_text()
        lines = _tail_lines(tail)
        said = f"\nits stderr ended with:\n{lines}" if lines else " (it wrote nothing to stderr)"
        if not child.ready:
            why = f"the compiler process did not start: {child.python} (from {child.origin}) {how}"
            log.error("%s%s", why, f"; stderr:\n{tail}" * bool(tail))
            self._fail_pending(why + said)
            return
        culprit = self._jobs.pop(self._sent, None) if self._sent is not None else None
        self._sent = None
        name = culprit.source.debug_name if culprit is not None else "no kernel (it was idle)"
        log.warning(
            "the compiler process (pid %d) %s while compiling %s%s",
            child.pid,
            how,
            name,
            f"; stderr:\n{tail}" * bool(tail),
        )
        if culprit is not None:
            culprit._fail(f"{CRASHED} ({how}; the host is fine): edit the source to retry{said}")
        self._pump()  # the jobs behind it start a new child

    def _overdue(self, child: ChildPipe) -> None:
        """The job in ``child`` ran past the deadline: end the child, fail that job, go on with the next."""
        culprit = self._jobs.pop(self._sent, None) if self._sent is not None else None
        self._sent, self._child = None, None
        self.overdue += 1
        name = culprit.source.debug_name if culprit is not None else "a kernel"
        child.kill(f"compiling {name} took longer than {self.job_deadline_s:g} s")
        how = child.finish()
        log.warning(
            "the compiler process (pid %d) was ended (%s): compiling %s took longer than %g s",
            child.pid,
            how,
            name,
            self.job_deadline_s,
        )
        if culprit is not None:
            path = getattr(culprit.source, "path", None)  # a kernel file's path, for the message's file
            culprit._fail(
                f"compiling {name} took longer than the compiler's {self.job_deadline_s:g} s deadline, so the "
                "compiler process was ended (the host and the other kernels are fine): look for what the "
                "source makes the compiler wait on or loop over (an #include of a pipe or device, a huge "
                "unrolled loop), then edit it to retry",
                file=None if path is None else str(path),
            )
        self._pump()  # the jobs behind it start a new child

    def _fail_pending(self, message: str) -> None:
        """Fail the job in the child and every job waiting for it (a child that cannot work at all)."""
        if self._sent is not None:
            job = self._jobs.pop(self._sent, None)
            if job is not None:
                job._fail(message)
            self._sent = None
        while self._queue:
            job = self._jobs.pop(self._queue.popleft()[0], None)
            if job is not None:
                job._fail(message)

    def close(self) -> None:
        """Stop the child; jobs not done fail. Idempotent."""
        with self._lock:
            self._closed = True
            child, self._child, self._sent = self._child, None, None
            self._queue.clear()
            for job in self._jobs.values():
                job._fail("the compiler process was closed before this kernel compiled")
            self._jobs.clear()
        if child is not None:
            child.close()

    def __repr__(self) -> str:
        return f"<CompilerProcess pid={self.child_pid} jobs={self.in_flight} closed={self._closed}>"


_lock = threading.Lock()
_process: CompilerProcess | None = None


def compiler_process() -> CompilerProcess | None:
    """The shared compiler process (None where compiles stay in this process, see ``processes_allowed``)."""
    global _process
    if not processes_allowed():
        return None
    with _lock:
        if _process is None or _process.is_closed:
            _process = CompilerProcess()
        return _process


@atexit.register
def _shutdown() -> None:
    if _process is not None:
        _process.close()
