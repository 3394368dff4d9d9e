"""ChildPipe: one running compiler child and its pipes, read without ever blocking the reader.

The compiler process (``compiler_process.py``) owns the jobs; this owns the child program: it starts
``python -c BOOTSTRAP`` (``_compiler_child.py``) with the parent's ``sys.path``, reads the frames
and the stderr that came back as far as they are there (non-blocking descriptors and a selector on
POSIX, ``PeekNamedPipe`` on Windows, where ``select`` does not take pipes), keeps the tail of
stderr to say why a child ended, and ends a child that cannot be used, with its whole process
group (a wrapper script's grandchild would keep the pipes open and hide the end).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from ._compiler_child import BOOTSTRAP, FrameReader

__all__ = ["ChildPipe", "READY_TIMEOUT_S", "STDERR_KEEP", "describe_exit"]

#: Characters of the child's stderr kept for messages (the log gets all of them, a block the last lines).
STDERR_KEEP = 8000
#: A child that has not said it is ready by then is killed (a wrong executable can open a window and wait).
READY_TIMEOUT_S = 60.0


def describe_exit(returncode: int | None) -> str:
    """How a child ended, in words: ``killed by SIGKILL``, ``exited with code 1``, ..."""
    if returncode is None:
        return "closed its output but is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (the system may have run out of memory)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    if sys.platform == "win32" and returncode >= 0xC0000000:  # an NTSTATUS: the process faulted
        known = {0xC0000005: "access violation", 0xC00000FD: "stack overflow", 0xC0000409: "stack buffer overrun"}
        what = known.get(returncode, "fault")
        return f"ended by a {what} (status 0x{returncode:08X})"
    return f"exited with code {returncode}"


def parent_sys_path() -> list[str]:
    """This process's ``sys.path`` as absolute paths, for a child process to import from where this one
    does ("" means the current directory; the child starts there too, but it is said explicitly)."""
    return [os.path.abspath(p) if p else os.getcwd() for p in sys.path if isinstance(p, str)]


class ChildPipe:
    """One running child: its pipes read without blocking, the frames and stderr that came back.

    Args:
        python: The interpreter to run.
        origin: Where that choice came from (for messages). ``sys.executable`` gets the parent's
            ``sys.path`` in the parent's order; an explicit interpreter keeps its own entries first
            (its standard library) and gets the parent's after them.

    Raises:
        OSError: the interpreter cannot be started (missing, not executable).
    """

    def __init__(self, python: str, origin: str) -> None:
        env = dict(os.environ)
        env["CUDAPATCH_COMPILER_PATH"] = json.dumps(parent_sys_path())
        # Our own interpreter: the parent's path exactly. Another one keeps its own standard library first.
        env["CUDAPATCH_COMPILER_PATH_ORDER"] = "first" if origin == "sys.executable" else "last"
        flags = 0
        if sys.platform == "win32":  # no console window from a GUI host; the counterpart of nice 10
            flags = subprocess.CREATE_NO_WINDOW | subprocess.BELOW_NORMAL_PRIORITY_CLASS  # type: ignore[attr-defined]
        self.python, self.origin = python, origin
        self.proc = subprocess.Popen(
            [python, "-c", BOOTSTRAP],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            env=env,
            close_fds=True,
            creationflags=flags,
            # Its own process group: Ctrl+C in a terminal stays with the host, and ``kill`` also ends
            # what a wrapper script started (a grandchild holding the pipes would hide the end).
            start_new_session=sys.platform != "win32",
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self._in = self.proc.stdin.fileno()
        self._out = self.proc.stdout.fileno()
        self._err = self.proc.stderr.fileno()
        self.frames = FrameReader()
        self.stderr = bytearray()
        self.ready = False
        self.eof = False
        self.killed = False
        self.started = time.monotonic()
        self._posix = sys.platform != "win32"
        self._selector = None
        if self._posix:
            import selectors

            os.set_blocking(self._out, False)
            os.set_blocking(self._err, False)
            self._selector = selectors.DefaultSelector()  # not select(): hosts can have fds over 1024
            self._selector.register(self._out, selectors.EVENT_READ)
            self._selector.register(self._err, selectors.EVENT_READ)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def write(self, data: bytes) -> None:
        """Send bytes to the child (blocks while its pipe is full). Raises OSError when it is gone."""
        view = memoryview(data)
        while view:
            view = view[os.write(self._in, view) :]

    def wait_readable(self, timeout: float) -> None:
        """Return when the child has written something (or ended), or after ``timeout`` seconds."""
        selector = self._selector
        if self._posix:
            if selector is not None:
                selector.select(timeout)
            return
        end = time.monotonic() + timeout
        while self._available(self._out) == 0 and self._available(self._err) == 0:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.001))

    def _available(self, fd: int) -> int:
        """Windows: bytes waiting in the pipe, -1 at its end (PeekNamedPipe never blocks)."""
        import _winapi
        import msvcrt

        try:
            return _winapi.PeekNamedPipe(msvcrt.get_osfhandle(fd), 0)[0]  # type: ignore[attr-defined]
        except OSError:  # broken pipe: the child closed its end
            return -1

    def _read(self, fd: int) -> bytes | None:
        """What ``fd`` holds now without blocking (b"" at its end, None when nothing is there)."""
        if not self._posix:
            n = self._available(fd)
            if n == 0:
                return None
            return b"" if n < 0 else os.read(fd, n)
        try:
            return os.read(fd, 1 << 20)
        except BlockingIOError:
            return None

    def read(self) -> list[bytes]:
        """The frames that arrived (payloads); sets ``eof`` when the child's stdout has ended."""
        self._read_stderr()
        payloads: list[bytes] = []
        while not self.eof:
            data = self._read(self._out)
            if data is None:
                break
            if not data:
                self.eof = True
                break
            try:
                payloads += self.frames.feed(data)
            except ValueError as exc:  # not our child speaking (a wrong executable): end it
                self.kill(f"its output is not cudapatch's protocol ({exc})")
                break
        if not self.ready and not self.eof and time.monotonic() - self.started > READY_TIMEOUT_S:
            self.kill(f"it did not answer within {READY_TIMEOUT_S:.0f} s")
        if self.killed and self.proc.poll() is not None:
            self.eof = True  # whatever still holds its pipes open, it is over
        return payloads

    def kill(self, why: str) -> None:
        """End a child that cannot be used; ``why`` joins its stderr for the message, and its end follows."""
        self.stderr += f"\n(cudapatch: {why}; killed it)\n".encode()
        self.killed = True
        self._kill()

    def _kill(self) -> None:
        try:
            if sys.platform == "win32":
                self.proc.kill()
            else:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the group: see start_new_session
        except OSError:  # already gone
            pass

    def _read_stderr(self) -> bool:
        """Keep the tail of what the child wrote to stderr; True at its end."""
        while True:
            data = self._read(self._err)
            if data is None:
                return False
            if not data:
                return True
            self.stderr += data
            if len(self.stderr) > STDERR_KEEP:
                del self.stderr[: len(self.stderr) - STDERR_KEEP]

    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def finish(self) -> str:
        """After the child's output ended: reap it and read the rest of its stderr; how it ended, in words."""
        try:
            code = self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # stdout closed, process alive: it is of no use any more
            self._kill()
            code = self.proc.wait(timeout=5.0)
        end = time.monotonic() + 1.0
        while not self._read_stderr() and time.monotonic() < end:
            time.sleep(0.005)
        self.close()
        return describe_exit(code)

    def close(self) -> None:
        """End the child (closing its stdin tells it to exit) and release the pipes; idempotent."""
        proc = self.proc
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self._kill()
            proc.wait(timeout=5.0)
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        for f in (proc.stdout, proc.stderr):
            if f is not None and not f.closed:
                f.close()
