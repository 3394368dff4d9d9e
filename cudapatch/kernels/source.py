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
    """

    descriptor: KernelDescriptor
    image: bytes = field(repr=False, compare=False)
    kind: Literal["ptx", "cubin"]
    key: str
    debug_name: str = field(compare=False)


class KernelSource:
    """Base of every kernel source. Subclasses are frozen dataclasses (hashable, comparable)."""

    @property
    def debug_name(self) -> str:
        """Short name for messages."""
        raise NotImplementedError

    def load(self) -> KernelImage:
        """Read (or compile) the kernel.

        Raises:
            KernelLoadError: the source cannot be turned into a loadable kernel.
        """
        raise NotImplementedError

    def watched_files(self) -> tuple[Path, ...]:
        """Files whose change should reload this source (empty for in-memory sources)."""
        return ()


@dataclass(frozen=True)
class PtxFileSource(KernelSource):
    """A PTX file with its VL.CudaGraph-style JSON sidecar (``kernel.ptx`` + ``kernel.json``).

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

    def watched_files(self) -> tuple[Path, ...]:
        return (self.ptx_path, self.sidecar_path)  # type: ignore[return-value]

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
        try:
            raw = self.ptx_path.read_bytes()
        except FileNotFoundError:
            raise KernelLoadError("PTX file not found", file=str(self.ptx_path), kernel=desc.entry_point) from None
        except OSError as exc:
            raise KernelLoadError(f"cannot read PTX: {exc}", file=str(self.ptx_path), kernel=desc.entry_point) from None
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
