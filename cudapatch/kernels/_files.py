"""Reading user files safely: every loader (sidecar JSON, PTX, ``.cu``, patch TOML, the cubin cache)
reads through here, so a bad file becomes a cudapatch error naming it and never hangs or escapes.

What a user can put where a file is expected, and what happens:

- a FIFO, a device, a directory or a socket: refused before it is opened for reading (``stat``
  first), and opened with ``O_NONBLOCK`` in case it was swapped for one in between, so a reader
  never blocks on a pipe nobody writes to;
- a file larger than the loader's limit: refused, with the limit in the message (a limit bounds
  the time every parser takes);
- a path with a NUL byte (``"k\\u0000.cu"``, ``ValueError`` from the OS layer) or longer than the
  file system takes (``ENAMETOOLONG``): refused, naming the path;
- text that is not UTF-8 (a Latin-1 ``é`` in a comment): refused, with the line and column of the
  first bad byte.

Errors are raised as the caller's error class (``SidecarError``, ``PatchFileError`` ...) so each
loader keeps the error type its users catch.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from ..errors import CudapatchError, KernelLoadError

__all__ = [
    "MAX_CU_BYTES",
    "MAX_PATCH_BYTES",
    "MAX_PTX_BYTES",
    "MAX_SIDECAR_BYTES",
    "MAX_CACHE_ENTRY_BYTES",
    "MAX_PATH_BYTES",
    "MAX_NAME_BYTES",
    "check_path_text",
    "decode_utf8",
    "read_user_bytes",
    "read_user_text",
    "describe_size",
    "file_kind",
]

#: Size limits per kind of file. Real files are far below them (a sidecar is a few hundred bytes,
#: a large PTX library tens of MB); they exist so that every parser's time stays bounded.
MAX_SIDECAR_BYTES = 1 << 20
MAX_PTX_BYTES = 64 << 20
MAX_CU_BYTES = 16 << 20
MAX_PATCH_BYTES = 8 << 20
MAX_CACHE_ENTRY_BYTES = 256 << 20
#: Linux's PATH_MAX and NAME_MAX: longer paths fail in the OS with ENAMETOOLONG.
MAX_PATH_BYTES = 4095
MAX_NAME_BYTES = 255

_KIND_NAMES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def describe_size(n: int) -> str:
    """``n`` bytes in words: ``512 bytes``, ``64 KiB``, ``8 MiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words (``a FIFO (named pipe)``), from its ``st_mode``."""
    return next((name for test, name in _KIND_NAMES if test(mode)), "not a regular file")


def check_path_text(
    path: str | os.PathLike[str], *, what: str, error: type[CudapatchError] = KernelLoadError, **context: object
) -> None:
    """Refuse a path the OS cannot take: a NUL byte, or longer than ``MAX_PATH_BYTES`` in all or
    ``MAX_NAME_BYTES`` in one component.

    Args:
        path: The path as the user wrote it.
        what: What the file is, for the message (``"kernel sidecar JSON"``).
        error: The error class to raise.
        **context: ``block=``, ``param=``, ``kernel=`` ... for the error.

    Raises:
        CudapatchError: (of class ``error``) the path is unusable; ``file`` is a shortened form of it.
    """
    text = os.fspath(path)
    shown = text if len(text) <= 80 else text[:60] + "…" + text[-16:]
    if "\0" in text:
        raise error(f"the {what} path contains a NUL byte (\\u0000)", file=shown.replace("\0", "\\0"), **context)  # type: ignore[arg-type]
    encoded = os.fsencode(text)
    if len(encoded) > MAX_PATH_BYTES:
        raise error(  # type: ignore[misc]
            f"the {what} path is {len(encoded)} bytes long; paths may have at most {MAX_PATH_BYTES}",
            file=shown,
            **context,
        )
    longest = max((len(part) for part in encoded.replace(b"\\", b"/").split(b"/")), default=0)
    if longest > MAX_NAME_BYTES:
        raise error(  # type: ignore[misc]
            f"a name in the {what} path is {longest} bytes long; file names may have at most {MAX_NAME_BYTES}",
            file=shown,
            **context,
        )


def read_user_bytes(
    path: str | os.PathLike[str],
    *,
    what: str,
    limit: int,
    error: type[CudapatchError] = KernelLoadError,
    **context: object,
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, never blocking on a non-regular one.

    Args:
        path: The file.
        what: What the file is, for messages (``"PTX file"``).
        limit: The largest size accepted, in bytes.
        error: The error class to raise (a ``CudapatchError``).
        **context: ``block=``, ``kernel=`` ... for the error.

    Raises:
        CudapatchError: (of class ``error``) missing, unreadable, not a regular file, too large, or an
            unusable path; ``file`` names it.
    """
    check_path_text(path, what=what, error=error, **context)
    file = os.fspath(path)

    def fail(message: str) -> CudapatchError:
        return error(message, file=file, **context)  # type: ignore[arg-type]

    try:
        st = os.stat(file)
        if not stat.S_ISREG(st.st_mode):
            raise fail(f"the {what} is {file_kind(st.st_mode)}, not a regular file")
        _check_size(st.st_size, what, limit, fail)
        # O_NONBLOCK: if the path became a FIFO since the stat, opening it does not wait for a writer.
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(file, flags)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise fail(f"the {what} is {file_kind(st.st_mode)}, not a regular file")
            _check_size(st.st_size, what, limit, fail)
            chunks = []
            left = limit + 1  # one byte more than allowed tells a file that grew past the limit
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise fail(f"{what} not found (cannot read it)") from None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise fail(f"the {what} path is too long for this file system") from None
        raise fail(f"cannot read the {what}: {exc.strerror or exc}") from None
    except ValueError as exc:  # what check_path_text does not foresee, e.g. an unencodable path
        raise fail(f"cannot read the {what}: {exc}") from None
    data = b"".join(chunks)
    _check_size(len(data), what, limit, fail)
    return data


def _check_size(size: int, what: str, limit: int, fail: Callable[[str], CudapatchError]) -> None:
    if size > limit:
        raise fail(f"the {what} is {describe_size(size)}, more than the {describe_size(limit)} cudapatch reads for one")


def decode_utf8(
    raw: bytes, *, what: str, file: str | Path, error: type[CudapatchError] = KernelLoadError, **context: object
) -> str:
    """``raw`` as UTF-8 text.

    Raises:
        CudapatchError: (of class ``error``) not UTF-8; names the file, and the line and column of the
            first byte that is not.
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        bad = raw[exc.start : exc.end].hex(" ")
        raise error(  # type: ignore[misc]
            f"the {what} is not UTF-8 text: byte {bad} at line {line}, column {column} ({exc.reason}); "
            "save it as UTF-8",
            file=str(file),
            line=line,
            **context,
        ) from None


def read_user_text(
    path: str | os.PathLike[str],
    *,
    what: str,
    limit: int,
    error: type[CudapatchError] = KernelLoadError,
    **context: object,
) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes (see ``read_user_bytes``).

    Raises:
        CudapatchError: (of class ``error``) as ``read_user_bytes``, or not UTF-8 (with line and column).
    """
    raw = read_user_bytes(path, what=what, limit=limit, error=error, **context)
    return decode_utf8(raw, what=what, file=os.fspath(path), error=error, **context)
