"""BuildWorker: the thread a live engine plans, realizes and instantiates its graphs on.

A Cold build costs milliseconds per hundred blocks (measured on the H100 host: 48 ms at 1,000 blocks,
half planning, half realizing), so on the frame thread it drops frames. The frame thread hands the
worker one job at a time (a closure over a frozen snapshot of the patch) and keeps launching the
running graph; the worker runs it and leaves the outcome for the frame thread to take at the next
frame boundary (``done`` is a plain attribute: the frame path tests it with one load). Edits made
meanwhile are not queued here: they leave the patch dirty, and the engine starts one build for all
of them once this one is taken (coalescing).

The worker makes the engine's CUDA context current on its thread before the first job (buffers,
graph nodes and instantiation are driver calls on that context) and never touches what the frame
thread owns: the patch model, the running executable graph, the diagnostic board (see
docs/architecture.md, "Threads, processes and locks").
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..kernels.pacing import FRAME_GUARD, FrameGate, checkpoint

__all__ = ["BuildWorker"]

log = logging.getLogger("cudapatch.engine")

#: GIL switch interval while a build runs. A build is pure Python between short driver calls, and a
#: thread that waits for the GIL gets it only after the holder's interval (5 ms by default). The
#: frame thread gives the GIL up in every driver call of ``update()`` (cuda-bindings releases it), so
#: at the default it waited several intervals per frame: 27 ms slowest ``update()`` during a build of
#: a 1,000-block chain (measured on the H200 host). At 0.1 ms a frame waits at most a fraction of a
#: millisecond, and the build slows by the switches (a few per cent).
BUILD_SWITCH_INTERVAL_S = 1e-4

#: How many jobs deferred work that yields (``BuildWorker.defer``) gives way to before it runs to its
#: end: freeing what a build replaced (Python objects; retired graphs are closed first, not put off)
#: waits for at most this many later builds. Five edits of a 1,000-block chain, each right after the
#: last went live, on the CPU machine: live in 4 / 3 / 3 / 3 / 4 frames at 4 (three runs), 4 / 3 / 4 /
#: 5 / 6 when nothing gave way.
GIVE_WAY = 4

#: How long a build waits for the end of a frame before it goes on anyway (frames stopped coming):
#: before it instantiates and before its deferred work (``BuildWorker.pace``, ``BuildWorker.defer``).
PACE_TIMEOUT_S = 0.05

_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.0


def _lower_switch_interval() -> None:
    global _switch_users, _switch_saved
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_saved, BUILD_SWITCH_INTERVAL_S))
        _switch_users += 1


def _restore_switch_interval() -> None:
    global _switch_users
    with _switch_lock:
        _switch_users -= 1
        if _switch_users == 0:
            sys.setswitchinterval(_switch_saved)


class BuildWorker:
    """One background thread that runs one build job at a time.

    Args:
        make_current: Makes the engine's CUDA context current on the calling thread (called on the
            worker's thread before each job).
        name: The thread's name.
        around_job: A context each job and its deferred work run in (the engine's: the collector
            paused, ``collector.py``).
    """

    def __init__(
        self,
        make_current: Callable[[], None],
        *,
        name: str = "cudapatch-build",
        around_job: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> None:
        self._make_current = make_current
        self._around_job = around_job
        #: A job waits here for the end of a frame (``pace``); the engine opens it after a frame while
        #: ``gate.wanted``, and ``wait`` opens it (the frame thread waiting has no frame to give).
        self.gate = FrameGate()
        # Work run after the outcome is out (``defer``) and with no job in flight (``later``), each with
        # how many more times it may give way to a job (``defer(yields=True)``).
        self._tail: list[tuple[Callable[[], Any], int]] = []
        self._chores: list[tuple[Callable[[], Any], int]] = []
        self._yielding = False  # deferred work that may give way to a job runs (``preempted``)
        self._short_switch = False  # the switch interval is lowered for this worker's work (``_hand_over``)
        #: True while work deferred after a build (``defer``, ``later``) runs or waits for a frame's end:
        #: the frame thread then holds ``FRAME_GUARD`` too, and that work yields at its checkpoints.
        self.tailing = False
        self._name = name
        self._cv = threading.Condition()
        self._job: Callable[[], Any] | None = None
        self._outcome: Any = None
        self._thread: threading.Thread | None = None
        self._closed = False
        #: True from ``submit`` until the outcome is taken (the engine's ``building``).
        self.busy = False
        #: True once a job finished and its outcome waits to be taken: the frame path tests this.
        self.done = False

    def submit(self, job: Callable[[], Any]) -> None:
        """Run ``job`` on the worker's thread. Only while not ``busy`` (one build at a time).

        Raises:
            RuntimeError: a build is already in flight, or the worker is closed.
        """
        with self._cv:
            if self.busy or self._closed:
                raise RuntimeError("a build is in flight" if self.busy else "the build worker is closed")
            self.busy, self.done, self._job = True, False, job
            self.gate.open()  # deferred work waiting for a frame's end (``_run_tail``) yields to the job now
            self._hand_over()

    def later(self, fn: Callable[[], Any], *, yields: bool = False) -> None:
        """From the frame thread: run ``fn`` on the worker's thread after the end of a frame (closing
        retired graphs an edit frame found idle: 12 ms at 10,000 nodes, measured on the H100 host, which
        the frame would otherwise spend). With a job in flight, ``fn`` runs after it, with its deferred
        work; once closed, here and now. ``wait`` and ``close`` wait for it.

        ``yields``: ``fn`` gives way to jobs as work ``defer(yields=True)`` does; it only prepares for
        later builds (spare parameter storages), so once closed it is dropped instead."""
        gives = GIVE_WAY if yields else 0
        with self._cv:
            if not self._closed:
                if self._job is not None:
                    self._tail.append((fn, gives))
                else:
                    self._chores.append((fn, gives))
                    self._hand_over()
                self._cv.notify_all()
                return
        if not yields:
            fn()

    def _hand_over(self) -> None:
        # Under ``_cv``, on the frame thread: lower the switch interval here, before the worker's thread
        # runs. Lowered by that thread, the frame's next driver call (which releases the GIL, and lets
        # the woken thread take it) waited up to the default 5 ms for the GIL again: 5.2-5.8 ms
        # launches in edit frames at 1,000 blocks (H100 host). The thread restores it once idle.
        if not self._short_switch:
            _lower_switch_interval()
            self._short_switch = True
        if self._thread is None or not self._thread.is_alive():  # (again, if an error escaped a chore)
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._cv.notify_all()

    def _run(self) -> None:
        try:
            self._serve()
        finally:  # the thread ends (closed, or something escaped a chore): the interval as it was
            with self._cv:
                if self._short_switch:
                    _restore_switch_interval()
                    self._short_switch = False

    def _serve(self) -> None:
        # The outcome handed over last: once the frame thread let it go, the reference here is its
        # last, and dropping it frees the build's snapshot and job in one cascade of deallocations
        # (1.5 ms at fused 10,000 blocks on the CPU machine, where the next job's outcome replaced it,
        # any time) that holds the interpreter from the frames. The next job frees it right after the
        # frame that follows it ends, when the next frame is furthest away.
        last: Any = None
        while True:
            with self._cv:
                if self._job is None and not self._chores and self._short_switch:  # idle: as it was
                    _restore_switch_interval()
                    self._short_switch = False
                while self._job is None and not self._chores and not self._closed:
                    self._cv.wait()
                if self._job is None:
                    chores, self._chores = self._chores, []
                    if not chores:  # closed with nothing to do
                        return
                    self.tailing = True
                    job = None
                else:
                    job = self._job
            if job is None:
                try:
                    self._make_current()
                except Exception as exc:  # nothing waits for it: say so, and drop the chores
                    log.warning("work handed to the build thread was dropped: %s", exc)
                    chores = []
                self._run_tail(chores)
                continue
            try:
                # Handed over in the middle of an edit frame: the rest of that frame (its Hot values,
                # its launch) first, not each of its driver calls waiting for this thread's GIL
                # (1.0-1.4 ms for 20 Hot values, H100 host).
                checkpoint()
                self._make_current()
                if last is not None:
                    self.defer([last].clear)  # (right after the next frame: ``structure``)
                    last = None
                with self._around_job():
                    outcome = job()
            except BaseException as exc:  # handed to the frame thread, which raises or reports it
                outcome = _Raised(exc)
            job = None
            with self._cv:
                tail, self._tail = self._tail, []
                self.tailing = bool(tail)
                self._job, self._outcome = None, outcome
                self.done = True  # last: the frame thread takes the outcome once it sees this
                self._cv.notify_all()
            last, outcome = outcome, None
            if tail:
                self._run_tail(tail)

    def pace(self) -> None:
        """From a job: return at the end of the next frame (at most ``PACE_TIMEOUT_S`` later), so that
        a driver call holding the driver's lock runs between two frames."""
        self.gate.next_frame(PACE_TIMEOUT_S)

    def defer(self, fn: Callable[[], Any], *, yields: bool = False) -> None:
        """From a job: run ``fn`` once the job's outcome is handed over, after the end of the next
        frame (driver calls that hold the driver's lock, like destroying retired graphs, then run
        between two frames and no longer delay the build). ``wait`` and ``close`` wait for it.

        ``yields``: ``fn`` gives way to a job submitted meanwhile (freeing what a build replaced must
        not hold up the next build): it is put off until after that job, or, where it asks
        ``preempted`` as it goes, stops and returns a callable that does the rest. It gives way to
        ``GIVE_WAY`` jobs at most, then runs to its end (edits coming every frame cannot pile it up)."""
        self._tail.append((fn, GIVE_WAY if yields else 0))

    @property
    def closing(self) -> bool:
        """``close`` was called: work that only prepares later builds can stop (``later(yields=True)``)."""
        return self._closed

    def preempted(self) -> bool:
        """From deferred work that yields: a job waits for this thread (stop, and return the rest)."""
        return self._yielding and self._job is not None

    def _run_tail(self, tail: list[tuple[Callable[[], Any], int]]) -> None:
        # Freeing what the last build replaced must not hold up the next build: an edit right after
        # another (1,000 blocks) went live a frame or two later while the worker freed the old plan.
        tail = list(tail)
        try:
            # After the end of the next frame; with a job waiting (``submit`` opens the gate: one that
            # comes meanwhile ends the wait), after the end of the frame that submitted it (which holds
            # the frame guard while the worker tails: closing a graph holds the driver's lock).
            self.gate.next_frame(PACE_TIMEOUT_S, unless=lambda: self._job is not None)
            if self._job is not None:
                checkpoint()
            with self._around_job():  # freeing a retired plan is build work too
                while tail:
                    fn, yields = tail[0]
                    if yields and self._job is not None:  # a build waits: it first, what yields after it
                        with self._cv:  # (what does not yield, closing retired graphs, still runs first)
                            self._tail[:0] = [(f, y - 1) for f, y in tail if y]
                        tail = [(f, y) for f, y in tail if not y]
                        checkpoint()  # (the job came during this work: the frame that submitted it first)
                        continue
                    del tail[0]
                    self._yielding = yields > 0
                    try:
                        rest = fn()
                    except Exception as exc:  # nothing waits for it: say so, and go on
                        log.warning("work deferred after a build failed: %s", exc)
                        continue
                    finally:
                        self._yielding = False
                    if yields and callable(rest):  # stopped for a waiting job: the rest comes back here
                        tail.insert(0, (rest, yields))
        finally:
            with self._cv:
                self.tailing = False
                self._cv.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the job in flight (if any) finished; returns whether none is running now."""

        def idle() -> bool:
            return self._job is None and not self.tailing and not self._chores

        deadline = None if timeout is None else time.monotonic() + timeout
        lifted = FRAME_GUARD.lift()  # waited for inside a frame (a fault's recovery): the build must not wait for it
        try:
            with self._cv:
                while True:
                    self.gate.open()  # a job waiting for a frame has none to wait for now
                    left = 0.005 if deadline is None else min(0.005, deadline - time.monotonic())
                    if self._cv.wait_for(idle, max(left, 0.0)) or (
                        deadline is not None and time.monotonic() >= deadline
                    ):
                        return idle()
        finally:
            if lifted:
                FRAME_GUARD.enter()

    def take(self) -> Any:
        """The finished job's outcome (on the frame thread, after ``done``); the worker is free again.

        Raises:
            BaseException: what the job raised (a bug, or a driver error the build did not expect).
        """
        with self._cv:
            if not self.done:
                raise RuntimeError("no finished build to take")
            outcome, self._outcome = self._outcome, None
            self.done = self.busy = False
        if isinstance(outcome, _Raised):
            raise outcome.exc
        return outcome

    def close(self, timeout: float | None = None) -> Any:
        """Let the job in flight finish, stop the thread; idempotent. Returns the outcome nobody took
        (the caller releases what it holds), or None.

        Raises:
            BaseException: what an untaken job raised.
        """
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self.wait(timeout)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        return self.take() if self.done else None

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<BuildWorker busy={self.busy} done={self.done} closed={self._closed}>"


class _Raised:
    """A job's exception, carried to the frame thread."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
