"""CudaSource: a CUDA C++ kernel (text or ``.cu`` file) compiled by NVRTC to a cubin for the device.

Files (the ``.cu`` and its quoted ``#include``s) are read through ``_files``: a regular file of at
most 16 MiB, UTF-8; anything else is a ``KernelLoadError`` naming the file. An include that cannot be
read is left to NVRTC, which reports it with the line that includes it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import CudapatchError, KernelLoadError
from ._files import MAX_CU_BYTES, read_user_bytes, read_user_text
from ._toolchain import nvrtc_compile, toolchain_version
from .cache import cache_key
from .descriptor import KernelDescriptor
from .signature import describe_cuda_source
from .source import KernelImage, KernelSource

__all__ = ["CudaSource"]

# [ \t] and [^"\n]: no part of the pattern spans lines (\s* at every line start of blank lines is quadratic)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.MULTILINE)


def _regular_file(path: Path) -> Path | None:
    """``path`` resolved if it names a regular file; None for anything else, and for paths the OS
    refuses (a NUL byte, too long) rather than an exception."""
    try:
        resolved = path.resolve()
        return resolved if resolved.is_file() else None
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a symlink loop (before Python 3.13)
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

    def includes(self) -> tuple[Path, ...]:
        """The quoted ``#include`` files this source pulls in (recursively), that exist."""
        found: list[Path] = []
        seen: set[Path] = set()
        stack = [(self.text(), self._search_dirs())]
        while stack:
            text, dirs = stack.pop()
            for name in _INCLUDE.findall(text):
                for d in dirs:
                    candidate = _regular_file(d / name)
                    if candidate is not None:
                        if candidate not in seen:
                            seen.add(candidate)
                            found.append(candidate)
                            try:
                                inc = read_user_text(candidate, what="included file", limit=MAX_CU_BYTES)
                            except CudapatchError:
                                pass  # NVRTC reports it, at the line that includes it
                            else:
                                stack.append((inc, [candidate.parent, *dirs]))
                        break
        return tuple(found)

    def watched_files(self) -> tuple[Path, ...]:
        if self.path is None:
            return tuple(self.includes())
        try:
            return (self.path, *self.includes())
        except KernelLoadError:
            return (self.path,)

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
        for inc in self.includes():
            try:
                parts += [str(inc), read_user_bytes(inc, what="included file", limit=MAX_CU_BYTES)]
            except CudapatchError:
                parts.append(str(inc))
        return cache_key(*parts)

    def compile(self, arch: str) -> KernelImage:
        text = self.text()
        desc = describe_cuda_source(text, self.entry, file=self._label)
        cubin, symbol, _log = nvrtc_compile(
            text, name=self._label, entry=desc.entry_point, arch=arch, options=self._nvrtc_options()
        )
        return KernelImage(desc, cubin, "cubin", hashlib.sha256(cubin).hexdigest(), self._label, symbol=symbol)
