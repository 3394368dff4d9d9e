"""Kernel sources: where a kernel's code and descriptor come from.

A ``KernelSource`` is frozen and hashable; ``load()`` reads (and later, compiles) it into a
``KernelImage``: the descriptor plus the module bytes the driver loads, keyed by content hash.
Loading is file I/O only; the driver is not touched until the ModuleCache loads the image.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import KernelLoadError, PtxSignatureError, SidecarError
from ._files import MAX_PTX_BYTES, MAX_SIDECAR_BYTES, decode_utf8, read_user_bytes
from ._toolchain import link_ptx, toolchain_version
from .cache import cache_key
from .descriptor import KernelDescriptor, parse_sidecar
from .ptx import check_signature, parse_ptx

__all__ = ["KernelImage", "KernelSource", "PtxFileSource", "bundled_kernel", "BUNDLED_KERNEL_DIR"]

BUNDLED_KERNEL_DIR = Path(__file__).parent / "ptx"


@dataclass(frozen=True)
class KernelImage:
    """A loadable kernel: descriptor, module bytes and the content key the module cache uses.

    Attributes:
        descriptor: Entry point, parameters, block size.
        image: The module bytes (PTX text or cubin).
        kind: ``ptx`` or ``cubin``.
        key: Content hash of ``image`` (hex), part of the module-cache key.
        debug_name: Where it came from, for messages (a file path or a label).
        symbol: The entry point's name in the module (mangled for C++ and Numba kernels).
        jit_level: For PTX: the driver's JIT optimisation level (``CU_JIT_OPTIMIZATION_LEVEL``, 0-4);
            None for the driver's default (4, the most optimised).
    """

    descriptor: KernelDescriptor
    image: bytes = field(repr=False, compare=False)
    kind: Literal["ptx", "cubin"]
    key: str
    debug_name: str = field(compare=False)
    symbol: str = ""
    jit_level: int | None = None

    @property
    def entry_symbol(self) -> str:
        return self.symbol or self.descriptor.entry_point


class KernelSource:
    """Base of every kernel source. Subclasses are frozen dataclasses (hashable, comparable).

    ``describe()`` is cheap (it reads a sidecar, a signature or Python types) and is what blocks use;
    ``compile(arch)`` is expensive and runs on the engine's background compiler, keyed by
    ``cache_key(arch)`` in the cubin cache.
    """

    @property
    def debug_name(self) -> str:
        """Short name for messages."""
        raise NotImplementedError

    def describe(self) -> KernelDescriptor:
        """The kernel's descriptor (no compilation).

        Raises:
            KernelLoadError: the source cannot be read or its signature is not usable.
        """
        raise NotImplementedError

    def cache_key(self, arch: str) -> str:
        """Content key of what ``compile(arch)`` would produce (reads files; no compilation).

        Raises:
            KernelLoadError: the source cannot be read.
        """
        raise NotImplementedError

    def compile(self, arch: str) -> KernelImage:
        """Compile to a cubin for ``arch``.

        Raises:
            KernelLoadError: the source cannot be read; KernelCompileError (a subclass) with the log.
        """
        raise NotImplementedError

    def watched_files(self) -> tuple[Path, ...]:
        """Files whose change should recompile this source (empty for in-memory sources)."""
        return ()

    def upgrade(self) -> KernelSource | None:
        """A better build of the same kernel (same descriptor, same results) to compile once this one
        runs and swap in through the Code tier, or None. A source built fast so that an edit is live
        at once (``ProgramSource`` at a low JIT level) names its optimised build here."""
        return None

    @property
    def portable(self) -> bool:
        """True if the source can be sent to a compiler process (pickled by value or importable name)."""
        return False

    @property
    def disk_cached(self) -> bool:
        """Whether its build is worth keeping in the disk cache (False: one of many short-lived
        variants, kept in memory only; a specialised fused kernel, ``ProgramSource.specialized``)."""
        return True


def _read_ptx(path: Path) -> bytes:
    return read_user_bytes(path, what="PTX file", limit=MAX_PTX_BYTES, error=KernelLoadError)


def _read_sidecar(path: Path) -> bytes:
    return read_user_bytes(path, what="kernel sidecar JSON", limit=MAX_SIDECAR_BYTES, error=SidecarError)


_CHECKED: OrderedDict[tuple[str, str, str], KernelDescriptor] = OrderedDict()
_CHECKED_ITEMS = 32
_CHECKED_LOCK = threading.Lock()


def _checked(ptx: bytes, sidecar: bytes, ptx_file: str, sidecar_file: str) -> KernelDescriptor:
    """The sidecar's descriptor, once the PTX is parsed and checked against it: once per content
    (a block's description, the cache lookup and the compiler all ask, and a PTX of thousands of
    entries takes a while). Keyed by digests, so the cache holds no file contents."""
    key = (cache_key(ptx, sidecar), ptx_file, sidecar_file)
    with _CHECKED_LOCK:
        desc = _CHECKED.get(key)
        if desc is not None:
            _CHECKED.move_to_end(key)
            return desc
    side_text = decode_utf8(sidecar, what="kernel sidecar JSON", file=sidecar_file, error=SidecarError)
    desc = parse_sidecar(side_text, file=sidecar_file)
    text = decode_utf8(ptx, what="PTX file", file=ptx_file, error=PtxSignatureError)
    info = parse_ptx(text, file=ptx_file)
    if info.version is None:
        raise PtxSignatureError("no .version directive: this is not a PTX module", file=ptx_file)
    check_signature(info, desc, file=ptx_file, sidecar=sidecar_file)
    with _CHECKED_LOCK:
        _CHECKED[key] = desc
        while len(_CHECKED) > _CHECKED_ITEMS:
            _CHECKED.popitem(last=False)
    return desc


# Descriptors by what the files' stats say (path, inode, size, modification time of the PTX and the
# sidecar): making a block of a bundled kernel (a ``Scale``) read and hashed both files at every
# description, a third of a host's ``create`` of one (0.4 ms on the CPU machine). An edited file has
# another modification time, so it is read again, unless the edit came within the clock tick of the
# last look (file times advance by ticks, ms apart): a file modified less than ``_SETTLED_NS`` ago is
# read every time, as git does for its "racily clean" entries.
_SETTLED_NS = 2_000_000_000
_DESCRIBED: OrderedDict[tuple[tuple[str, int, int, int], ...], KernelDescriptor] = OrderedDict()


def _stat_key(*paths: Path) -> tuple[tuple[str, int, int, int], ...] | None:
    try:
        stats = [(str(p), os.stat(p)) for p in paths]
    except OSError:  # (``load`` reports it)
        return None
    if any(time.time_ns() - st.st_mtime_ns < _SETTLED_NS for _, st in stats):  # (see ``_SETTLED_NS``)
        return None
    return tuple((name, st.st_ino, st.st_size, st.st_mtime_ns) for name, st in stats)


@dataclass(frozen=True)
class PtxFileSource(KernelSource):
    """A PTX file with its VL.CudaGraph-style JSON sidecar (``kernel.ptx`` + ``kernel.json``).

    Compiled to a cubin with nvJitLink, so the driver never JITs it on the frame path.

    Args:
        ptx_path: The ``.ptx`` file.
        sidecar_path: The ``.json`` sidecar; defaults to the PTX path with ``.json``.
    """

    ptx_path: Path
    sidecar_path: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ptx_path", Path(self.ptx_path))
        if self.sidecar_path is None:
            object.__setattr__(self, "sidecar_path", Path(self.ptx_path).with_suffix(".json"))
        else:
            object.__setattr__(self, "sidecar_path", Path(self.sidecar_path))

    @property
    def debug_name(self) -> str:
        return self.ptx_path.name

    @property
    def portable(self) -> bool:
        return True

    def watched_files(self) -> tuple[Path, ...]:
        return (self.ptx_path, self.sidecar_path)  # type: ignore[return-value]

    def describe(self) -> KernelDescriptor:
        key = _stat_key(self.ptx_path, self.sidecar_path)  # type: ignore[arg-type]
        if key is not None:
            with _CHECKED_LOCK:
                desc = _DESCRIBED.get(key)
                if desc is not None:
                    _DESCRIBED.move_to_end(key)
                    return desc
        desc = self.load().descriptor
        if key is not None:
            with _CHECKED_LOCK:
                _DESCRIBED[key] = desc
                while len(_DESCRIBED) > _CHECKED_ITEMS:
                    _DESCRIBED.popitem(last=False)
        return desc

    def cache_key(self, arch: str) -> str:
        raw = _read_ptx(self.ptx_path)
        side = _read_sidecar(self.sidecar_path)  # type: ignore[arg-type]
        return cache_key("ptx", raw, side, arch, toolchain_version())

    def load(self) -> KernelImage:
        """Read the sidecar and the PTX and check the PTX entry against the sidecar.

        Raises:
            SidecarError: sidecar missing, unreadable or invalid.
            PtxSignatureError: PTX not UTF-8 or not PTX, entry missing or its parameters disagree with the sidecar.
            KernelLoadError: PTX file missing, unreadable, not a regular file or too large.
        """
        sidecar = self.sidecar_path
        assert sidecar is not None
        side = _read_sidecar(sidecar)
        raw = _read_ptx(self.ptx_path)
        desc = _checked(raw, side, str(self.ptx_path), str(sidecar))
        image = raw if raw.endswith(b"\0") else raw + b"\0"  # the driver wants NUL-terminated PTX
        return KernelImage(
            descriptor=desc,
            image=image,
            kind="ptx",
            key=hashlib.sha256(image).hexdigest(),
            debug_name=str(self.ptx_path),
        )

    def compile(self, arch: str) -> KernelImage:
        ptx = self.load()
        cubin = link_ptx(ptx.image, name=str(self.ptx_path), arch=arch, kernel=ptx.descriptor.entry_point)
        return KernelImage(ptx.descriptor, cubin, "cubin", hashlib.sha256(cubin).hexdigest(), str(self.ptx_path))


def bundled_kernel(name: str) -> PtxFileSource:
    """The bundled kernel ``name`` from ``cudapatch/kernels/ptx`` (``vector_add``, ``scale`` ...).

    Raises:
        KernelLoadError: no bundled kernel of that name.
    """
    path = BUNDLED_KERNEL_DIR / f"{name}.ptx"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in BUNDLED_KERNEL_DIR.glob("*.ptx")))
        raise KernelLoadError(f"no bundled kernel '{name}' (bundled: {known})", file=str(path))
    return PtxFileSource(path)
