"""The engine child seen from the host: its pipes, written and read without blocking the frame.

Like the compiler's ``ChildPipe`` (``kernels/_child_pipe.py``), from which it takes the frames and
the way a child's end is told, but for a long-lived partner: messages to the child are queued and
written as far as the pipe takes them (a patch of large kernel sources must not stall a frame while
a fresh child is still importing), and the child inherits the descriptor of the shared frame word.
The child runs in a session of its own so Ctrl+C stays with the host.
"""

from __future__ import annotations

import json
import os
import pickle
import selectors
import signal
import subprocess
import threading
import time
from typing import Any

from .._reaper import reap_in_background
from ..engine.replay import replay_environment
from ..kernels._child_pipe import STDERR_KEEP, describe_exit, parent_sys_path
from ..kernels._compiler_child import FrameReader, encode_frame
from .child import BOOTSTRAP

__all__ = ["EngineProcess"]


class EngineProcess:
    """One running engine child.

    Args:
        python: The interpreter (a Python of the host's version with cudapatch importable).
        pass_fds: Descriptors the child inherits (the frame word).
        device: The device whose context the child makes while it waits for ``start``.

    Raises:
        OSError: the interpreter cannot be started.
    """

    def __init__(self, python: str, pass_fds: tuple[int, ...] = (), device: int | None = None) -> None:
        env = dict(os.environ)
        env["CUDAPATCH_ISOLATED_PATH"] = json.dumps(parent_sys_path())
        if device is not None:
            env["CUDAPATCH_ISOLATED_DEVICE"] = str(device)
            # The child's fault replay process, started by its bootstrap before anything is imported.
            replay = replay_environment(device)
            env["CUDAPATCH_ISOLATED_REPLAY"] = json.dumps({k: v for k, v in replay.items() if env.get(k) != v})
        self.proc = subprocess.Popen(
            [python, "-c", BOOTSTRAP],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            env=env,
            close_fds=True,
            pass_fds=pass_fds,
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self._in, self._out, self._err = self.proc.stdin.fileno(), self.proc.stdout.fileno(), self.proc.stderr.fileno()
        for fd in (self._in, self._out, self._err):
            os.set_blocking(fd, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._out, selectors.EVENT_READ)
        self._frames = FrameReader()
        self._outbox = bytearray()
        self.stderr = bytearray()
        self.eof = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        """The process has not ended (a reserve child may have, e.g. killed from outside)."""
        return self.proc.poll() is None

    def send(self, message: Any) -> None:
        """Queue ``message`` and write what the pipe takes now (never blocks)."""
        self._outbox += encode_frame(message)
        self.flush()

    def flush(self) -> None:
        """Write queued bytes as far as the pipe takes them."""
        box = self._outbox
        while box:
            try:
                n = os.write(self._in, box)
            except BlockingIOError:
                return
            except OSError:  # the child is gone: read() finds out how
                box.clear()
                return
            del box[:n]

    def read(self) -> list[Any]:
        """The messages that arrived (unpickled); sets ``eof`` at the end of the child's output."""
        if self._outbox:
            self.flush()
        self._read_stderr()
        out: list[Any] = []
        while not self.eof:
            try:
                data = os.read(self._out, 1 << 20)
            except BlockingIOError:
                break
            if not data:
                self.eof = True
                break
            out += [pickle.loads(p) for p in self._frames.feed(data)]
        return out

    def wait_readable(self, timeout: float) -> None:
        """Return when the child wrote something (or ended), or after ``timeout`` seconds."""
        if self._outbox:
            self.flush()
        self._selector.select(timeout)

    def _read_stderr(self) -> None:
        while True:
            try:
                data = os.read(self._err, 1 << 16)
            except BlockingIOError:
                return
            if not data:
                return
            self.stderr += data
            if len(self.stderr) > STDERR_KEEP:
                del self.stderr[: len(self.stderr) - STDERR_KEEP]

    def stderr_text(self) -> str:
        self._read_stderr()
        return self.stderr.decode("utf-8", "replace")

    def release(self, timeout: float = 10.0) -> threading.Thread:
        """Close the child's stdin (it exits) and reap it on a background thread, killed after
        ``timeout`` seconds: for a child that reported a GPU fault, whose exit waits for the driver to
        tear its faulted context down. The next child starts meanwhile. Nothing else may be called on
        this object afterwards.

        Returns:
            The reaping thread.
        """
        self.flush()
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        self._selector.close()
        return reap_in_background(self.proc, timeout=timeout, kill=self._kill_group)

    def _kill_group(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)

    def close(self, timeout: float = 5.0) -> str:
        """Close the child's stdin (it exits), reap it, release the pipes; how it ended, in words."""
        self.flush()
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        end = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < end:
            self._read_stderr()
            time.sleep(0.002)
        if self.proc.poll() is None:
            try:
                self._kill_group()
            except OSError:
                pass
            self.proc.wait(timeout=5.0)
        self._read_stderr()
        self._selector.close()
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None and not f.closed:
                f.close()
        return describe_exit(self.proc.returncode)
