"""CudaSource: a CUDA C++ kernel (text or ``.cu`` file) compiled by NVRTC to a cubin for the device.

Files (the ``.cu`` and its quoted ``#include``s) are read through ``_files``: a regular file of at
most 16 MiB, UTF-8; anything else is a ``KernelLoadError`` naming the file. Quoted includes are found
as NVRTC finds them (an absolute name as it is; otherwise the directory of the including file, then
the ``-I`` directories in order, skipping directories of that name). One that names a FIFO, a device
or a socket is refused before compiling, naming the include and the file and line that include it:
NVRTC would open it and wait forever for a writer. An include that is missing or cannot be read is
left to NVRTC, which reports it with the line that includes it.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import CudapatchError, KernelLoadError
from ._files import MAX_CU_BYTES, file_kind, read_user_bytes, read_user_text
from ._toolchain import nvrtc_compile, toolchain_version
from .cache import cache_key
from .descriptor import KernelDescriptor
from .signature import describe_cuda_source
from .source import KernelImage, KernelSource

__all__ = ["CudaSource"]

# [ \t] and [^"\n]: no part of the pattern spans lines (\s* at every line start of blank lines is quadratic)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.MULTILINE)


_INCLUDE_PATH_OPTION = re.compile(r"^(?:-I|--include-path=)(.+)$")


def _quoted_includes(text: str) -> Iterator[tuple[str, int]]:
    """``(name, line)`` of each quoted ``#include`` of ``text``, the line 1-based."""
    line, pos = 1, 0
    for m in _INCLUDE.finditer(text):
        line += text.count("\n", pos, m.start())  # counted from the last match: linear in the text
        pos = m.start()
        yield m.group(1), line


def _resolve_include(name: str, dirs: Sequence[Path], *, including: str, line: int) -> Path | None:
    """Where NVRTC finds ``#include "name"``: an absolute name as it is, otherwise the first of
    ``dirs`` that holds it (a directory of that name is passed over); None where none does.

    Raises:
        KernelLoadError: what it finds is a FIFO, a device or a socket; NVRTC would block reading it
            (a FIFO nobody writes to hung the compile for good). Names the include, ``including`` and ``line``.
    """
    candidates = [Path(name)] if os.path.isabs(name) else [d / name for d in dirs]
    for candidate in candidates:
        try:
            mode = os.stat(candidate).st_mode  # stat never opens: it cannot block on a FIFO
        except (OSError, ValueError):  # missing, unreadable, a NUL byte, too long: NVRTC reports it
            continue
        if stat.S_ISDIR(mode):
            continue
        if not stat.S_ISREG(mode):
            raise KernelLoadError(
                f'#include "{name}" finds {candidate}, {file_kind(mode)} and not a regular file: '
                "NVRTC would wait on it forever; include a regular file",
                file=including,
                line=line,
            )
        try:
            return candidate.resolve()
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (before Python 3.13)
            return candidate
    return None


@dataclass(frozen=True)
class CudaSource(KernelSource):
    """CUDA C++ compiled with NVRTC (``-arch=sm_XX``, C++17).

    Give either ``code`` (text, e.g. from a host operator's text field) or ``path`` (a ``.cu`` file,
    watched for edits together with its quoted ``#include``s). The descriptor comes from the
    ``__global__`` signature (see ``signature.describe_cuda_source``).

    Args:
        code: Source text.
        path: A ``.cu`` file (its directory is on the include path).
        entry: The kernel to use when the source has several.
        include_paths: Extra ``-I`` directories.
        defines: ``-D`` macros, as a mapping or ``(name, value)`` pairs.
        options: Further NVRTC options.
        name: Label for messages when ``code`` is given (defaults to ``kernel.cu``).
    """

    code: str | None = None
    path: Path | None = None
    entry: str | None = None
    include_paths: tuple[Path, ...] = ()
    defines: tuple[tuple[str, str], ...] = ()
    options: tuple[str, ...] = ()
    name: str | None = None

    def __post_init__(self) -> None:
        if (self.code is None) == (self.path is None):
            raise ValueError("CudaSource needs exactly one of code= and path=")
        if self.path is not None:
            object.__setattr__(self, "path", Path(self.path))
        object.__setattr__(self, "include_paths", tuple(Path(p) for p in self.include_paths))
        defines = self.defines
        if isinstance(defines, Mapping):
            defines = tuple(sorted((str(k), str(v)) for k, v in defines.items()))
        object.__setattr__(self, "defines", tuple(tuple(d) for d in defines))
        object.__setattr__(self, "options", tuple(self.options))

    @property
    def debug_name(self) -> str:
        return self.path.name if self.path is not None else (self.name or "kernel.cu")

    @property
    def portable(self) -> bool:
        return True

    @property
    def _label(self) -> str:
        return str(self.path) if self.path is not None else (self.name or "kernel.cu")

    def text(self) -> str:
        """The source text (read from ``path`` if given).

        Raises:
            KernelLoadError: the file is missing, unreadable, not a regular file, over 16 MiB or not UTF-8.
        """
        if self.code is not None:
            return self.code
        assert self.path is not None
        return read_user_text(self.path, what="CUDA source file", limit=MAX_CU_BYTES, error=KernelLoadError)

    def _search_dirs(self) -> list[Path]:
        dirs = [self.path.parent] if self.path is not None else []
        return dirs + list(self.include_paths)

    def _include_dirs(self) -> list[Path]:
        """The ``-I`` directories NVRTC gets from us and from ``options``, in its search order (the
        CUDA headers' directory, searched last, is no user input and is left out)."""
        extra = [Path(m.group(1)) for o in self.options if (m := _INCLUDE_PATH_OPTION.match(o))]
        return self._search_dirs() + extra

    def includes(self) -> tuple[Path, ...]:
        """The quoted ``#include`` files this source pulls in (recursively) that exist, found as NVRTC finds them.

        Raises:
            KernelLoadError: the ``.cu`` cannot be read, or an include names a FIFO, a device or a
                socket (NVRTC would block on it); the error names the include, the including file and line.
        """
        return self._includes_of(self.text())

    def _includes_of(self, text: str) -> tuple[Path, ...]:
        """``includes`` of ``text``, this source's text as already read: ``cache_key`` and ``compile`` walk
        the text they hash or compile, not a second read of the ``.cu`` that an edit may have changed.

        Raises:
            KernelLoadError: an include names a FIFO, a device or a socket (as ``includes``).
        """
        found: list[Path] = []
        seen: set[Path] = set()
        search = self._include_dirs()
        # NVRTC looks first beside the program's name (for ``code``, a bare name: the working directory).
        stack = [(text, self._label, [Path(self._label).parent, *search])]
        while stack:
            text, including, dirs = stack.pop()
            for name, line in _quoted_includes(text):
                target = _resolve_include(name, dirs, including=including, line=line)
                if target is None or target in seen:
                    continue
                seen.add(target)
                found.append(target)
                try:
                    inc = read_user_text(target, what="included file", limit=MAX_CU_BYTES)
                except CudapatchError:
                    continue  # NVRTC reports it, at the line that includes it
                stack.append((inc, str(target), [target.parent, *search]))
        return tuple(found)

    def watched_files(self) -> tuple[Path, ...]:
        own = () if self.path is None else (self.path,)
        try:
            return (*own, *self.includes())
        except KernelLoadError:  # the build reports it (cache_key and compile raise it)
            return own

    def describe(self) -> KernelDescriptor:
        return describe_cuda_source(self.text(), self.entry, file=self._label)

    def _nvrtc_options(self) -> tuple[str, ...]:
        return (
            *(f"-I{d}" for d in self._search_dirs()),
            *(f"-D{k}={v}" if v != "" else f"-D{k}" for k, v in self.defines),
            *self.options,
        )

    def cache_key(self, arch: str) -> str:
        text = self.text()
        parts: list[str | bytes] = ["cuda", text, self.entry or "", arch, toolchain_version(), *self._nvrtc_options()]
        for inc in self._includes_of(text):
            try:
                parts += [str(inc), read_user_bytes(inc, what="included file", limit=MAX_CU_BYTES)]
            except CudapatchError:
                parts.append(str(inc))
        return cache_key(*parts)

    def compile(self, arch: str) -> KernelImage:
        text = self.text()
        desc = describe_cuda_source(text, self.entry, file=self._label)
        # Walked again, not taken from the cache key's walk: a header can become a FIFO after the key was made
        # (and a compile mostly runs in the compiler process, from a pickled copy); refused here, just before
        # NVRTC opens it, it cannot block NVRTC.
        self._includes_of(text)
        cubin, symbol, _log = nvrtc_compile(
            text, name=self._label, entry=desc.entry_point, arch=arch, options=self._nvrtc_options()
        )
        return KernelImage(desc, cubin, "cubin", hashlib.sha256(cubin).hexdigest(), self._label, symbol=symbol)
