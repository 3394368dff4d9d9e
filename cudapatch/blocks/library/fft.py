"""FFT block: cuFFT forward and inverse transforms (C2C, R2C, C2R; 1-D and 2-D; batched), captured.

Complex values are ``float2`` (``double2`` in double precision): real and imaginary parts
interleaved, the layout of NumPy's complex64 / complex128. Transforms are unnormalised, like
cuFFT and FFTW: a forward then inverse transform multiplies by the transform size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...kernels.types import DType
from ..block import Block
from ..builder import BlockBuilder
from ..captured import CallDescriptor, buffer_in, buffer_out, host_scalar
from ..description import computed
from ..libraries import LibraryScope, nvmath_module

__all__ = ["FFT"]

# kind -> (input is complex, output is complex, cuFFT type name for float, for double)
_KINDS: dict[str, tuple[bool, bool, str, str]] = {
    "C2C": (True, True, "C2C", "Z2Z"),
    "R2C": (False, True, "R2C", "D2Z"),
    "C2R": (True, False, "C2R", "Z2D"),
}


def _fft_type(kind: str, s: Mapping[str, Any]) -> str:
    """The cuFFT type name of ``kind`` at the block's precision (``R2C`` or ``D2Z``)."""
    _, _, single, double = _KINDS[kind]
    return double if s["double"] else single


def _shape(s: Mapping[str, Any]) -> tuple[int, ...]:
    nx, ny = int(s["Nx"]), int(s["Ny"])
    return (ny, nx) if ny > 1 else (nx,)


def _per_item(kind: str, nx: int, ny: int, side: str) -> int:
    """Elements of one transform on the ``in`` or ``out`` side (the half spectrum for real data)."""
    rows = max(ny, 1)
    complex_side = _KINDS[kind][0] if side == "in" else _KINDS[kind][1]
    real_kind = kind != "C2C"
    return rows * (nx // 2 + 1) if (real_kind and complex_side) else rows * nx


def _batch(count: int, kind: str, v: Mapping[str, Any]) -> int:
    return count // max(_per_item(kind, int(v["Nx"]), int(v["Ny"]), "in"), 1)


def _make(kind: str) -> tuple[Any, Any, Any, Any]:
    """The call, prepare, validate and output-size functions of one kind (module-level, made once,
    so descriptions compare equal between describes)."""

    def prepare(p: Mapping[str, int], s: Mapping[str, Any], libs: LibraryScope) -> None:
        libs.fft_plan(_fft_type(kind, s), _shape(s), s["Batch"])

    def call(stream: int, p: Mapping[str, int], s: Mapping[str, Any], libs: LibraryScope) -> None:
        fft = nvmath_module("cufft")
        plan = libs.fft_plan(_fft_type(kind, s), _shape(s), s["Batch"], stream)
        direction = 1 if int(s["Inverse"]) else -1  # CUFFT_INVERSE / CUFFT_FORWARD
        if kind == "C2C":
            (fft.exec_z2z if s["double"] else fft.exec_c2c)(plan, p["In"], p["Out"], direction)
        elif kind == "R2C":
            (fft.exec_d2z if s["double"] else fft.exec_r2c)(plan, p["In"], p["Out"])
        else:
            (fft.exec_z2d if s["double"] else fft.exec_c2r)(plan, p["In"], p["Out"])

    def validate(counts: Mapping[str, int], v: Mapping[str, Any]) -> str | None:
        n = counts.get("In")
        nx, ny = int(v["Nx"]), int(v["Ny"])
        per = _per_item(kind, nx, ny, "in")
        if n is not None and (n == 0 or n % per):
            shape = f"{ny}x{nx}" if ny > 1 else str(nx)
            return f"input 'In' has {n} elements, not a whole number of {kind} transforms of size {shape} ({per} each)"
        if kind != "C2C" and int(v["Inverse"]):
            return f"Inverse applies to C2C only; {kind} has a fixed direction"
        return None

    def out_size(count: int | None, v: Mapping[str, int]) -> int:
        return _batch(count or 0, kind, v) * _per_item(kind, v["Nx"], v["Ny"], "out")

    def batch(count: int | None, v: Mapping[str, int]) -> int:
        return _batch(count or 0, kind, v)

    for f in (prepare, call, validate, out_size, batch):
        f.__name__ = f"fft_{kind.lower()}_{f.__name__}"
    return call, prepare, validate, (out_size, batch)


_FUNCTIONS = {kind: _make(kind) for kind in _KINDS}


class FFT(Block):
    """A batched 1-D or 2-D FFT (cuFFT), captured into the graph.

    ``Kind``: ``C2C`` (complex to complex; ``Inverse`` picks the direction), ``R2C`` (real input,
    half spectrum of ``Nx // 2 + 1`` complex values per row out) or ``C2R`` (its inverse). ``Nx`` is
    the transform length (the row length in 2-D), ``Ny`` the number of rows for a 2-D transform (1:
    1-D). The batch is however many transforms the input holds. ``Precision``: float or double.
    Unnormalised, like cuFFT.
    """

    type_name = "FFT"

    def describe(self, b: BlockBuilder) -> None:
        kind = b.text("Kind", default="C2C", description="C2C, R2C or C2R", choices=tuple(_KINDS))
        text = b.text("Precision", default="float", description="float or double", choices=("float", "double"))
        double = text == "double"
        real, cplx = (DType.FLOAT64, DType.DOUBLE2) if double else (DType.FLOAT32, DType.FLOAT2)
        in_complex, out_complex = _KINDS[kind][:2]
        call, prepare, validate, (out_size, batch) = _FUNCTIONS[kind]
        desc = CallDescriptor.of(
            f"fft_{kind.lower()}",
            buffer_in("In", cplx if in_complex else real),
            buffer_out("Out", cplx if out_complex else real),
            host_scalar("Nx", "int"),
            host_scalar("Ny", "int"),
            host_scalar("Inverse", "int"),
            host_scalar("Batch", "int"),
            description=f"{kind} FFT (cuFFT)",
            double=double,
        )
        c = b.add_captured(call, desc, prepare=prepare, validate=validate, shape_params=("Nx", "Ny", "Inverse"))
        b.scalar("Nx", c.in_("Nx"), default=1024, range=(1, 1 << 27), description="transform (row) length")
        b.scalar("Ny", c.in_("Ny"), default=1, range=(1, 1 << 16), description="rows of a 2-D transform (1: 1-D)")
        b.scalar("Inverse", c.in_("Inverse"), default=0, range=(0, 1), description="C2C: 1 for the inverse transform")
        b.input("In", c.in_("In"))
        c.set_count("Batch", computed(batch, "Nx", "Ny", like="In"))
        b.output("Out", c.out("Out"), size=computed(out_size, "Nx", "Ny", like="In"))
