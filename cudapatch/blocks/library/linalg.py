"""Linear-algebra blocks captured from cuBLAS, cuSOLVER and cuSPARSE: GEMM, GEMV, LU solve, SpMV.

Matrices are flat, row-major buffers (NumPy's default order); the libraries are column-major, so
each call computes the transposed problem, which is the same bytes. ``alpha``/``beta`` are device
scalars: changing them is a device write, never a re-capture. Sizes (M, N, K ...) are structural:
changing one rebuilds the graph; a transpose flag re-captures the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...kernels.types import DType
from ..block import Block
from ..builder import BlockBuilder
from ..captured import CallDescriptor, buffer_in, buffer_inout, buffer_out, device_scalar, host_scalar
from ..description import computed, from_param
from ..libraries import LibraryScope, nvmath_module

__all__ = ["GEMM", "GEMV", "LUSolve", "SpMV", "LINALG_BLOCKS"]

_PRECISIONS = {"float": DType.FLOAT32, "double": DType.FLOAT64}
_CUDA_R = {DType.FLOAT32: 0, DType.FLOAT64: 1}  # cudaDataType CUDA_R_32F / CUDA_R_64F


def _precision(b: BlockBuilder) -> DType:
    text = b.text("Precision", default="float", description="element type: float or double", choices=tuple(_PRECISIONS))
    return _PRECISIONS[text]


def _expect(counts: Mapping[str, int], port: str, need: int, what: str) -> str | None:
    have = counts.get(port)
    if have is not None and have != need:
        return f"input '{port}' has {have} elements; {what} needs {need}"
    return None


# -- GEMM ---------------------------------------------------------------------------------------------
def _gemm_descriptor(dt: DType) -> CallDescriptor:
    return CallDescriptor.of(
        "gemm",
        buffer_in("A", dt),
        buffer_in("B", dt),
        buffer_inout("C", dt),
        host_scalar("M", "int"),
        host_scalar("N", "int"),
        host_scalar("K", "int"),
        host_scalar("TransA", "int"),
        host_scalar("TransB", "int"),
        device_scalar("Alpha", dt),
        device_scalar("Beta", dt),
        description="C = Alpha * op(A) @ op(B) + Beta * C (cuBLAS gemm)",
        double=dt is DType.FLOAT64,
    )


def _gemm_call(stream: int, p: Mapping[str, int], s: Mapping[str, Any], libs: LibraryScope) -> None:
    blas = nvmath_module("cublas")
    h = libs.cublas(stream)
    m, n, k, ta, tb = s["M"], s["N"], s["K"], int(s["TransA"]), int(s["TransB"])
    # Row-major C (M x N) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    gemm = blas.dgemm if s["double"] else blas.sgemm
    lda = m if ta else k
    ldb = k if tb else n
    gemm(h, tb, ta, n, m, k, p["Alpha"], p["B"], ldb, p["A"], lda, p["Beta"], p["C"], n)


def _c_size(_: int | None, v: Mapping[str, int]) -> int:
    return v["M"] * v["N"]


def _check_gemm(counts: Mapping[str, int], v: Mapping[str, Any]) -> str | None:
    m, n, k = int(v["M"]), int(v["N"]), int(v["K"])
    return _expect(counts, "A", m * k, f"an {m}x{k} matrix (M x K)") or _expect(
        counts, "B", k * n, f"a {k}x{n} matrix (K x N)"
    )


class GEMM(Block):
    """``C = Alpha * op(A) @ op(B) + Beta * C``: cuBLAS matrix multiply, captured into the graph.

    A is M x K (K x M with TransA), B is K x N (N x K with TransB), C is M x N, all row-major.
    C keeps its contents between frames, so ``Beta`` blends in the previous result. ``Alpha`` and
    ``Beta`` change with a device write (no re-capture); ``TransA``/``TransB`` re-capture; ``M``,
    ``N``, ``K`` rebuild. ``Precision``: float or double.
    """

    type_name = "GEMM"

    def describe(self, b: BlockBuilder) -> None:
        dt = _precision(b)
        c = b.add_captured(_gemm_call, _gemm_descriptor(dt), validate=_check_gemm, shape_params=("M", "N", "K"))
        for name, default in (("M", 256), ("N", 256), ("K", 256)):
            b.scalar(name, c.in_(name), default=default, range=(1, 1 << 20), description=f"matrix size {name}")
        b.scalar("TransA", c.in_("TransA"), default=0, range=(0, 1), description="1: use A transposed")
        b.scalar("TransB", c.in_("TransB"), default=0, range=(0, 1), description="1: use B transposed")
        b.scalar("Alpha", c.in_("Alpha"), default=1.0, description="scales A @ B (a device scalar)")
        b.scalar("Beta", c.in_("Beta"), default=0.0, description="scales the previous C (a device scalar)")
        b.input("A", c.in_("A"), description="M x K, row-major")
        b.input("B", c.in_("B"), description="K x N, row-major")
        b.output("C", c.out("C"), size=computed(_c_size, "M", "N"), description="M x N, row-major")


# -- GEMV ---------------------------------------------------------------------------------------------
def _gemv_descriptor(dt: DType) -> CallDescriptor:
    return CallDescriptor.of(
        "gemv",
        buffer_in("A", dt),
        buffer_in("X", dt),
        buffer_inout("Y", dt),
        host_scalar("M", "int"),
        host_scalar("N", "int"),
        host_scalar("Trans", "int"),
        device_scalar("Alpha", dt),
        device_scalar("Beta", dt),
        description="Y = Alpha * op(A) @ X + Beta * Y (cuBLAS gemv)",
        double=dt is DType.FLOAT64,
    )


def _gemv_call(stream: int, p: Mapping[str, int], s: Mapping[str, Any], libs: LibraryScope) -> None:
    blas = nvmath_module("cublas")
    h = libs.cublas(stream)
    m, n, t = s["M"], s["N"], int(s["Trans"])
    # Row-major A (M x N) is column-major A^T (N x M, ld N): A @ x is (A^T)^T x.
    op = 0 if t else 1
    gemv = blas.dgemv if s["double"] else blas.sgemv
    gemv(h, op, n, m, p["Alpha"], p["A"], n, p["X"], 1, p["Beta"], p["Y"], 1)


def _y_size(_: int | None, v: Mapping[str, int]) -> int:
    return v["N"] if v["Trans"] else v["M"]


def _check_gemv(counts: Mapping[str, int], v: Mapping[str, Any]) -> str | None:
    m, n, t = int(v["M"]), int(v["N"]), int(v["Trans"])
    return _expect(counts, "A", m * n, f"an {m}x{n} matrix (M x N)") or _expect(
        counts, "X", m if t else n, "X of length " + ("M (Trans)" if t else "N")
    )


class GEMV(Block):
    """``Y = Alpha * op(A) @ X + Beta * Y``: cuBLAS matrix-vector product. A is M x N row-major;
    X has N elements (M with ``Trans``), Y has M (N with ``Trans``)."""

    type_name = "GEMV"

    def describe(self, b: BlockBuilder) -> None:
        dt = _precision(b)
        c = b.add_captured(_gemv_call, _gemv_descriptor(dt), validate=_check_gemv, shape_params=("M", "N", "Trans"))
        b.scalar("M", c.in_("M"), default=256, range=(1, 1 << 24), description="rows of A")
        b.scalar("N", c.in_("N"), default=256, range=(1, 1 << 24), description="columns of A")
        b.scalar("Trans", c.in_("Trans"), default=0, range=(0, 1), description="1: use A transposed")
        b.scalar("Alpha", c.in_("Alpha"), default=1.0, description="a device scalar")
        b.scalar("Beta", c.in_("Beta"), default=0.0, description="scales the previous Y (a device scalar)")
        b.input("A", c.in_("A"), description="M x N, row-major")
        b.input("X", c.in_("X"))
        b.output("Y", c.out("Y"), size=computed(_y_size, "M", "N", "Trans"))


# -- LU solve -----------------------------------------------------------------------------------------
def _lu_descriptor(dt: DType) -> CallDescriptor:
    return CallDescriptor.of(
        "getrf+getrs",
        buffer_in("A", dt),
        buffer_in("B", dt),
        buffer_out("LU", dt),
        buffer_out("X", dt),
        buffer_out("Info", "int"),
        host_scalar("N", "int"),
        host_scalar("NRHS", "int"),
        description="LU-factor A (getrf) and solve A @ X = B (getrs)",
        double=dt is DType.FLOAT64,
    )


def _lu_prepare(p: Mapping[str, int], s: Mapping[str, Any], libs: LibraryScope) -> None:
    solver = nvmath_module("cusolverDn")
    h = libs.cusolver(libs.capture_stream_handle)
    n = s["N"]
    size = solver.dgetrf_buffer_size if s["double"] else solver.sgetrf_buffer_size
    lwork = size(h, n, n, p["LU"], n)
    libs.workspace("getrf", lwork * (8 if s["double"] else 4))
    libs.workspace("pivots", 4 * n)


def _lu_call(stream: int, p: Mapping[str, int], s: Mapping[str, Any], libs: LibraryScope) -> None:
    from ...kernels._driver import check, driver

    solver = nvmath_module("cusolverDn")
    d = driver()
    n, nrhs, item = s["N"], s["NRHS"], 8 if s["double"] else 4
    # getrf works in place: factor a copy, so the input buffer (another block's output) stays intact.
    check(d.cuMemcpyDtoDAsync(p["LU"], p["A"], n * n * item, stream), "cuMemcpyDtoDAsync")
    check(d.cuMemcpyDtoDAsync(p["X"], p["B"], n * nrhs * item, stream), "cuMemcpyDtoDAsync")
    h = libs.cusolver(stream)
    work, piv = libs.workspace("getrf", 0), libs.workspace("pivots", 0)
    getrf, getrs = (solver.dgetrf, solver.dgetrs) if s["double"] else (solver.sgetrf, solver.sgetrs)
    getrf(h, n, n, p["LU"], n, work, piv, p["Info"])
    # Row-major A is column-major A^T: solve (A^T)^T X = B with the transposed solve.
    getrs(h, 1, n, nrhs, p["LU"], n, piv, p["X"], n, p["Info"])


def _square(_: int | None, v: Mapping[str, int]) -> int:
    return v["N"] * v["N"]


def _rhs(_: int | None, v: Mapping[str, int]) -> int:
    return v["N"] * v["NRHS"]


def _check_lu(counts: Mapping[str, int], v: Mapping[str, Any]) -> str | None:
    n, nrhs = int(v["N"]), int(v["NRHS"])
    a = counts.get("A")
    if a is not None and a != n * n:
        root = int(round(a**0.5))
        shape = f"a square {root}x{root} matrix: set N to {root}" if root * root == a else "not a square matrix"
        return f"input 'A' has {a} elements, {shape} (N={n} needs {n * n})"
    return _expect(counts, "B", n * nrhs, f"NRHS={nrhs} right-hand sides of length N={n}")


class LUSolve(Block):
    """Solve ``A @ X = B`` by LU factorisation (cuSOLVER getrf + getrs), captured as one node.

    A is N x N row-major; B holds ``NRHS`` right-hand sides of length N one after another, and X
    the solutions the same way. ``LU`` outputs the factors (column-major, as LAPACK stores them),
    ``Info`` cuSOLVER's status (0: solved; i > 0: U(i,i) is zero, A is singular).
    """

    type_name = "LUSolve"

    def describe(self, b: BlockBuilder) -> None:
        dt = _precision(b)
        c = b.add_captured(
            _lu_call, _lu_descriptor(dt), prepare=_lu_prepare, validate=_check_lu, shape_params=("N", "NRHS")
        )
        b.scalar("N", c.in_("N"), default=64, range=(1, 1 << 15), description="A is N x N")
        b.scalar("NRHS", c.in_("NRHS"), default=1, range=(1, 1 << 15), description="number of right-hand sides")
        b.input("A", c.in_("A"), description="N x N, row-major")
        b.input("B", c.in_("B"), description="NRHS vectors of length N")
        b.output("X", c.out("X"), size=computed(_rhs, "N", "NRHS"))
        b.output("LU", c.out("LU"), size=computed(_square, "N"))
        b.output("Info", c.out("Info"), size=1)


# -- SpMV ---------------------------------------------------------------------------------------------
def _spmv_descriptor(dt: DType) -> CallDescriptor:
    return CallDescriptor.of(
        "spmv",
        buffer_in("RowOffsets", "int"),
        buffer_in("Columns", "int"),
        buffer_in("Values", dt),
        buffer_in("X", dt),
        buffer_inout("Y", dt),
        host_scalar("Rows", "int"),
        host_scalar("Cols", "int"),
        host_scalar("NonZeros", "int"),
        device_scalar("Alpha", dt),
        device_scalar("Beta", dt),
        description="Y = Alpha * A @ X + Beta * Y, A in CSR (cuSPARSE SpMV)",
        double=dt is DType.FLOAT64,
    )


def _spmv_descriptors(p: Mapping[str, int], s: Mapping[str, Any]) -> tuple[Any, Any, Any, int]:
    sp = nvmath_module("cusparse")
    dt = _CUDA_R[DType.FLOAT64 if s["double"] else DType.FLOAT32]
    i32 = sp.IndexType.INDEX_32I
    mat = sp.create_csr(
        s["Rows"], s["Cols"], s["NonZeros"], p["RowOffsets"], p["Columns"], p["Values"], i32, i32, 0, dt
    )
    x = sp.create_dn_vec(s["Cols"], p["X"], dt)
    y = sp.create_dn_vec(s["Rows"], p["Y"], dt)
    return mat, x, y, dt


def _spmv_release(mat: Any, x: Any, y: Any) -> None:
    sp = nvmath_module("cusparse")
    sp.destroy_sp_mat(mat)
    sp.destroy_dn_vec(x)
    sp.destroy_dn_vec(y)


def _spmv_prepare(p: Mapping[str, int], s: Mapping[str, Any], libs: LibraryScope) -> None:
    sp = nvmath_module("cusparse")
    h = libs.cusparse(libs.capture_stream_handle)
    mat, x, y, dt = _spmv_descriptors(p, s)
    try:
        size = sp.sp_mv_buffer_size(h, 0, p["Alpha"], mat, x, p["Beta"], y, dt, 0)
    finally:
        _spmv_release(mat, x, y)
    libs.workspace("spmv", size)


def _spmv_call(stream: int, p: Mapping[str, int], s: Mapping[str, Any], libs: LibraryScope) -> None:
    sp = nvmath_module("cusparse")
    h = libs.cusparse(stream)
    mat, x, y, dt = _spmv_descriptors(p, s)  # host-side descriptors: creating them enqueues nothing
    try:
        sp.sp_mv(h, 0, p["Alpha"], mat, x, p["Beta"], y, dt, 0, libs.workspace("spmv", 0))
    finally:
        _spmv_release(mat, x, y)


def _nnz(count: int | None, _: Mapping[str, int]) -> int:
    return int(count or 0)


def _check_spmv(counts: Mapping[str, int], v: Mapping[str, Any]) -> str | None:
    rows, cols = int(v["Rows"]), int(v["Cols"])
    nnz = counts.get("Values")
    if nnz is not None and counts.get("Columns") not in (None, nnz):
        return f"input 'Columns' has {counts['Columns']} elements but 'Values' has {nnz}: one column per value"
    return _expect(counts, "RowOffsets", rows + 1, f"Rows={rows} (Rows + 1 offsets)") or _expect(
        counts, "X", cols, f"Cols={cols}"
    )


class SpMV(Block):
    """``Y = Alpha * A @ X + Beta * Y`` with A sparse in CSR form (cuSPARSE SpMV): ``RowOffsets``
    (Rows + 1 ints), ``Columns`` (one int per non-zero), ``Values``. X has Cols elements, Y Rows."""

    type_name = "SpMV"

    def describe(self, b: BlockBuilder) -> None:
        dt = _precision(b)
        c = b.add_captured(
            _spmv_call, _spmv_descriptor(dt), prepare=_spmv_prepare, validate=_check_spmv, shape_params=("Rows", "Cols")
        )
        b.scalar("Rows", c.in_("Rows"), default=1024, range=(1, 1 << 30), description="rows of A")
        b.scalar("Cols", c.in_("Cols"), default=1024, range=(1, 1 << 30), description="columns of A")
        b.scalar("Alpha", c.in_("Alpha"), default=1.0, description="a device scalar")
        b.scalar("Beta", c.in_("Beta"), default=0.0, description="scales the previous Y (a device scalar)")
        b.input("RowOffsets", c.in_("RowOffsets"), description="CSR row offsets (Rows + 1)")
        b.input("Columns", c.in_("Columns"), description="CSR column index of each value")
        b.input("Values", c.in_("Values"), description="the non-zero values")
        b.input("X", c.in_("X"), description="Cols elements")
        c.set_count("NonZeros", computed(_nnz, like="Values"))
        b.output("Y", c.out("Y"), size=from_param("Rows"))


LINALG_BLOCKS = (GEMM, GEMV, LUSolve, SpMV)
