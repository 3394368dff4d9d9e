"""Waiting for a child process's exit off the caller's thread.

A process that met a sticky GPU fault (the isolated engine's child, the fault replay) has nothing
more to say once it has answered, but its exit is slow: the driver tears its faulted context down
as the process ends. Nothing the caller does next depends on that exit (the device memory of the
old process is not needed by the next one), so the caller hands the process here and goes on; a
daemon thread waits for it, kills it past a deadline, and closes its pipes.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable

__all__ = ["reap_in_background"]


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
            if then is not None:
                then(code)

    thread = threading.Thread(target=reap, name=f"cudapatch-reap-{proc.pid}", daemon=True)
    thread.start()
    return thread
