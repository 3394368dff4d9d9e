"""Kernel sources: where a kernel's code and descriptor come from.

A ``KernelSource`` is frozen and hashable; ``load()`` reads (and later, compiles) it into a
``KernelImage``: the descriptor plus the module bytes the driver loads, keyed by content hash.
Loading is file I/O only; the driver is not touched until the ModuleCache loads the image.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import KernelLoadError, PtxSignatureError
from ._toolchain import link_ptx, toolchain_version
from .cache import cache_key
from .descriptor import KernelDescriptor, load_sidecar
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
    """

    descriptor: KernelDescriptor
    image: bytes = field(repr=False, compare=False)
    kind: Literal["ptx", "cubin"]
    key: str
    debug_name: str = field(compare=False)
    symbol: str = ""

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

    @property
    def portable(self) -> bool:
        """True if the source can be sent to a compiler process (pickled by value or importable name)."""
        return False


def _read_bytes(path: Path, what: str, kernel: str | None = None) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise KernelLoadError(f"{what} not found", file=str(path), kernel=kernel) from None
    except OSError as exc:
        raise KernelLoadError(f"cannot read {what}: {exc}", file=str(path), kernel=kernel) from None


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
        return self.load().descriptor

    def cache_key(self, arch: str) -> str:
        raw = _read_bytes(self.ptx_path, "PTX file")
        side = _read_bytes(self.sidecar_path, "kernel sidecar JSON")  # type: ignore[arg-type]
        return cache_key("ptx", raw, side, arch, toolchain_version())

    def load(self) -> KernelImage:
        """Read the sidecar and the PTX and check the PTX entry against the sidecar.

        Raises:
            SidecarError: sidecar missing or invalid.
            PtxSignatureError: PTX entry missing or its parameters disagree with the sidecar.
            KernelLoadError: PTX file missing or unreadable.
        """
        sidecar = self.sidecar_path
        assert sidecar is not None
        desc: KernelDescriptor = load_sidecar(sidecar)
        raw = _read_bytes(self.ptx_path, "PTX file", desc.entry_point)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PtxSignatureError("PTX is not UTF-8 text", file=str(self.ptx_path)) from None
        info = parse_ptx(text, file=str(self.ptx_path))
        if info.version is None:
            raise PtxSignatureError("no .version directive: this is not a PTX module", file=str(self.ptx_path))
        check_signature(info, desc, file=str(self.ptx_path), sidecar=str(sidecar))
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
