"""Waiting for a child process's exit off the caller's thread.

A process that met a sticky GPU fault (the isolated engine's child, the fault replay) has nothing
more to say once it has answered, but its exit takes a while: the driver tears its faulted context
down as the process ends (about 0.06 s for a bare process on H100 + driver 580). What the caller
does next does not wait for that exit, so it hands the process here and goes on; a daemon thread
waits for it, kills it past a deadline, and closes its pipes. Until then the old process's device
memory is still held: on a nearly full GPU the next process's allocations can fail meanwhile.

A process about to end itself calls ``wait_for_all`` first, so that it never leaves a process it
started behind unreaped (its daemon threads end with it).
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable

__all__ = ["reap_in_background", "wait_for_all"]

_pending: dict[threading.Thread, Callable[[], None]] = {}  # each reaping thread: how to kill its process
_pending_lock = threading.Lock()


def reap_in_background(
    proc: subprocess.Popen,
    *,
    timeout: float,
    kill: Callable[[], None] | None = None,
    then: Callable[[int | None], None] | None = None,
) -> threading.Thread:
    """Wait for ``proc`` on a daemon thread; kill it if it has not ended after ``timeout`` seconds.

    Args:
        proc: The process (its stdin should be closed already, or it is told to end some other way).
        timeout: Seconds it may take to end on its own.
        kill: How to kill it (e.g. its whole process group); default ``proc.kill()``.
        then: Called on that thread with its return code once it is reaped (None if it could not be),
            after its pipes are closed.

    Returns:
        The thread (started; tests join it).
    """

    def reap() -> None:
        code: int | None = None
        me = threading.current_thread()
        try:
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                try:
                    (kill or proc.kill)()
                except OSError:
                    pass
                code = proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            code = proc.poll()
        finally:
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if f is not None and not f.closed:
                    try:
                        f.close()
                    except OSError:
                        pass
            with _pending_lock:
                _pending.pop(me, None)
            if then is not None:
                then(code)

    thread = threading.Thread(target=reap, name=f"cudapatch-reap-{proc.pid}", daemon=True)
    with _pending_lock:
        _pending[thread] = kill or proc.kill
    thread.start()
    return thread


def wait_for_all(timeout: float) -> None:
    """Wait up to ``timeout`` seconds for every process handed to ``reap_in_background``; kill those
    still running then, and reap them (a process about to end calls this: its daemon threads die
    with it, and what they waited for would be left to the system)."""
    deadline = time.monotonic() + timeout
    with _pending_lock:
        pending = list(_pending.items())
    for thread, _ in pending:
        thread.join(max(0.0, deadline - time.monotonic()))
    for thread, kill in pending:
        if thread.is_alive():
            with contextlib.suppress(OSError):
                kill()
            thread.join(5.0)
