"""The compiler child: the program that runs in the compiler process, and the frames it speaks.

The parent (``compiler_process.py``) starts it as a program of its own with ``subprocess.Popen``
(``python -c BOOTSTRAP``, which sets ``sys.path`` and calls ``main`` here), never through
``multiprocessing``: spawn re-imports the user's main module in the child, so a script without
``if __name__ == "__main__":`` ran its whole body again there, created engines and compilers of its
own and took the compiler down. Nothing here imports ``__main__``.

Protocol, over the child's stdin (requests) and stdout (replies): frames of an 8-byte big-endian
length and a pickle. The child first sends ``("ready", PROTOCOL, (major, minor), pid)`` once its
imports are done; then, for each request ``(job id, pickled source, arch)``, one reply
``(job id, pickled (image, error))``; an image whose descriptor is its source's comes without it
(``descriptor`` None), and the parent, which has the source, puts it back. Sources and results
are pickled separately from the frame so that one which does not load on the other side fails its
own job, not the pipe. The child compiles one job at a time and exits when its stdin closes (the
parent closed it, or died).

Anything else written to the child's stdout (a library that prints) would corrupt the frames, so
the child moves the protocol onto duplicated descriptors and points fd 1 at stderr, whose tail the
parent keeps to say why a child died; ``faulthandler`` prints the Python stack there on a fatal
signal (a compiler that segfaults).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import struct
import sys
from typing import Any

__all__ = ["PROTOCOL", "BOOTSTRAP", "FrameReader", "encode_frame", "main"]

#: Bumped when the frames change; a child of another cudapatch version is refused at the handshake.
PROTOCOL = 2

_HEADER = struct.Struct(">Q")
#: Larger frames are refused: a corrupt header must not make either side allocate without bound.
MAX_FRAME = 1 << 30

#: The ``-c`` program that starts a child: set ``sys.path`` from the parent before importing
#: cudapatch (an embedded host or a script may have put the package, or the modules that define
#: Numba kernels, on a path only the parent knows), then serve.
#: ``first``: the parent's entries in its order, then the child's own (same interpreter);
#: ``last``: the child's own first (an explicit interpreter keeps its standard library).
BOOTSTRAP = """\
import faulthandler, json, os, sys
faulthandler.enable()
_paths = json.loads(os.environ.pop("CUDAPATCH_COMPILER_PATH", "[]"))
if os.environ.pop("CUDAPATCH_COMPILER_PATH_ORDER", "first") == "first":
    sys.path[:] = _paths + [p for p in sys.path if p not in _paths]
else:
    sys.path.extend(p for p in _paths if p not in sys.path)
del _paths
from cudapatch.kernels._compiler_child import main
sys.exit(main())
"""


def encode_frame(message: Any) -> bytes:
    """One frame: the length header and the pickle of ``message``."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


class FrameReader:
    """Cuts a byte stream that arrives in pieces into frames (the parent reads what is there)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return the payloads of the frames now complete (not yet unpickled).

        Raises:
            ValueError: a header announces more than ``MAX_FRAME`` bytes (the stream is corrupt).
        """
        self._buf += data
        out = []
        while len(self._buf) >= _HEADER.size:
            (n,) = _HEADER.unpack_from(self._buf)
            if n > MAX_FRAME:
                raise ValueError(f"a frame of {n} bytes (more than {MAX_FRAME}): the stream is corrupt")
            if len(self._buf) < _HEADER.size + n:
                break
            out.append(bytes(self._buf[_HEADER.size : _HEADER.size + n]))
            del self._buf[: _HEADER.size + n]
        return out


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None  # the parent closed the pipe
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _compile(source_bytes: bytes, arch: str) -> tuple[Any, BaseException | None]:
    from ..errors import KernelLoadError

    try:
        source = pickle.loads(source_bytes)
    except Exception as exc:  # e.g. the module that defines a Numba kernel is not importable here
        return None, KernelLoadError(f"the compiler process cannot load this source: {type(exc).__name__}: {exc}")
    try:
        image = source.compile(arch)
    except Exception as exc:  # every compiler error goes back to the parent, as it was raised
        return None, exc
    return _without_own_descriptor(image, source), None


def _without_own_descriptor(image: Any, source: Any) -> Any:
    # The parent has the source, and its descriptor (a fused group's is worked out there anyway):
    # unpickling the descriptor of a 500-stage group was one C call of 2.2 ms (CPU machine) that
    # held the parent's interpreter, so a frame starting meanwhile waited for it.
    try:
        same = image.descriptor == source.describe()
    except Exception:  # (a descriptor that cannot be worked out here goes back as it is)
        return image
    return dataclasses.replace(image, descriptor=None) if same else image


def _reply(job_id: int, image: Any, error: BaseException | None) -> bytes:
    from ..errors import KernelCompileError

    try:
        return encode_frame((job_id, pickle.dumps((image, error), protocol=pickle.HIGHEST_PROTOCOL)))
    except Exception:  # an error that does not pickle goes back as text
        text = KernelCompileError(f"{type(error).__name__}: {error}")
        return encode_frame((job_id, pickle.dumps((None, text), protocol=pickle.HIGHEST_PROTOCOL)))


def _detach_stdio() -> tuple[int, int]:
    """Move the protocol off fds 0 and 1; stray output goes to stderr, stray reads see EOF."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    if sys.platform == "win32":
        import msvcrt

        for fd in (proto_in, proto_out):
            msvcrt.setmode(fd, os.O_BINARY)
    return proto_in, proto_out


def _lower_priority() -> None:
    if hasattr(os, "nice"):  # background work: where cores are short, frames (the host's threads) go first
        try:
            os.nice(10)
        except OSError:
            pass
    # On Windows the parent starts the child with BELOW_NORMAL_PRIORITY_CLASS instead.


def main() -> int:
    """Serve compile requests on stdin until it closes; returns the exit status (0)."""
    import signal

    proto_in, proto_out = _detach_stdio()
    # The parent decides when the child ends (it starts it in a session of its own on POSIX; a
    # Windows console still sends Ctrl+C to every process attached to it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _lower_priority()
    from . import source as _source  # noqa: F401  (import the kernel sources now, before saying ready)

    _write_all(proto_out, encode_frame(("ready", PROTOCOL, tuple(sys.version_info[:2]), os.getpid())))
    while True:
        header = _read_exact(proto_in, _HEADER.size)
        if header is None:
            return 0
        (n,) = _HEADER.unpack(header)
        if n > MAX_FRAME:
            print(f"cudapatch compiler: a request of {n} bytes: the stream is corrupt", file=sys.stderr)
            return 2
        payload = _read_exact(proto_in, n)
        if payload is None:
            return 0
        job_id, source_bytes, arch = pickle.loads(payload)
        image, error = _compile(source_bytes, arch)
        _write_all(proto_out, _reply(job_id, image, error))


if __name__ == "__main__":
    sys.exit(main())
