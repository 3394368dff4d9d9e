"""Captured library calls on the GPU: every built-in op against a float64 NumPy reference on fresh
random inputs, kernel -> GEMM -> kernel in one graph, the Recapture tier, device-scalar updates
that keep the captured graph, cuRAND's new numbers per frame, and the capture-safety errors."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Block, BlockBuilder, CallDescriptor, buffer_in, buffer_out, host_scalar, like
from cudapatch.blocks.library import FFT, GEMM, GEMV, LUSolve, Random, Scale, SpMV

pytestmark = pytest.mark.gpu

rng = np.random.default_rng()


def _poison(engine, block, port):
    engine.synchronize()
    engine.output(block, port).fill_bytes(0xFF)  # NaN for floats: unwritten elements show


def _run(engine, frames: int = 1):
    for _ in range(frames):
        engine.update()
    engine.synchronize()


@pytest.mark.parametrize("precision", ["float", "double"])
@pytest.mark.parametrize(("ta", "tb"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_matches_numpy(engine, precision, ta, tb):
    m, n, k = 67, 45, 131  # odd sizes: no lucky alignment
    dt = np.float32 if precision == "float" else np.float64
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dt)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dt)
    g = engine.add(GEMM(M=m, N=n, K=k, TransA=ta, TransB=tb, Precision=precision, Alpha=0.75))
    engine.bind(g, "A", a.ravel())
    engine.bind(g, "B", b.ravel())
    engine.wait_ready()
    _poison(engine, g, "C")
    _run(engine)
    ref = 0.75 * ((a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64))
    got = engine.read(g, "C").reshape(m, n)
    tol = 1e-4 if dt is np.float32 else 1e-12
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())
    assert engine.graph.captured_count == 1


def test_kernel_gemm_kernel_in_one_graph(engine):
    m = n = k = 64
    a = rng.standard_normal(m * k).astype(np.float32)
    b = rng.standard_normal(k * n).astype(np.float32)
    pre = engine.add(Scale(name="pre", Factor=2.0, Offset=1.0))
    g = engine.add(GEMM(M=m, N=n, K=k))
    post = engine.add(Scale(name="post", Factor=-1.0, Offset=0.5))
    engine.bind(pre, "In", a)
    engine.bind(g, "B", b)
    engine.connect(pre, "Out", g, "A")
    engine.connect(g, "C", post, "In")
    engine.wait_ready()
    _poison(engine, post, "Out")
    _run(engine, 3)
    ref = -((2.0 * a.astype(np.float64) + 1.0).reshape(m, k) @ b.astype(np.float64).reshape(k, n)) + 0.5
    np.testing.assert_allclose(engine.read(post, "Out").reshape(m, n), ref, rtol=1e-4, atol=1e-3)


def test_rebinding_an_input_recaptures_and_alpha_is_a_device_write(engine):
    import cupy as cp

    m = n = k = 48
    a1 = cp.asarray(rng.standard_normal(m * k).astype(np.float32))
    a2 = cp.asarray(rng.standard_normal(m * k).astype(np.float32))
    cp.cuda.get_current_stream().synchronize()  # bound arrays are written before the update
    b = rng.standard_normal(k * n).astype(np.float32)
    g = engine.add(GEMM(M=m, N=n, K=k))
    engine.bind(g, "A", a1)
    engine.bind(g, "B", b)
    engine.wait_ready()
    _run(engine)
    rebuilds = engine.counters.rebuilds
    # Warm rebind of A: a new pointer, the same size -> Recapture, no rebuild.
    engine.bind(g, "A", a2)
    _run(engine)
    assert engine.counters.recaptures == 1 and engine.counters.rebuilds == rebuilds
    bm = b.astype(np.float64).reshape(k, n)
    np.testing.assert_allclose(
        engine.read(g, "C").reshape(m, n), cp.asnumpy(a2).reshape(m, k) @ bm, rtol=1e-4, atol=1e-3
    )
    # Alpha: a device write; the captured graph is the same object, nothing re-captured.
    child = engine.graph.captured_graph(g.id)
    g.set("Alpha", -3.0)
    _run(engine)
    assert engine.graph.captured_graph(g.id) is child
    assert engine.counters.recaptures == 1 and engine.counters.rebuilds == rebuilds
    np.testing.assert_allclose(
        engine.read(g, "C").reshape(m, n), -3.0 * (cp.asnumpy(a2).reshape(m, k) @ bm), rtol=1e-4, atol=1e-3
    )
    # Beta blends the previous C: C1 = -3 AB; C2 = -3 AB + 0.5 * C1.
    g.set("Beta", 0.5)
    _run(engine)
    np.testing.assert_allclose(
        engine.read(g, "C").reshape(m, n), -4.5 * (cp.asnumpy(a2).reshape(m, k) @ bm), rtol=1e-4, atol=1e-2
    )
    # A host-mode flag re-captures (TransA: A read transposed). cuBLAS may pick a kernel sequence of
    # another shape for it; then the swap cannot be done in place and the graph is rebuilt, in the
    # same frame either way.
    g.set("TransA", 1)
    g.set("Beta", 0.0)
    _run(engine)
    assert engine.counters.recaptures + engine.counters.rebuilds == 2 + rebuilds, engine.counters
    assert not [d for d in engine.diagnostics(g) if d.severity == "error"]
    np.testing.assert_allclose(
        engine.read(g, "C").reshape(m, n), -3.0 * (cp.asnumpy(a2).reshape(k, m).T @ bm), rtol=1e-4, atol=1e-3
    )


def test_a_size_change_rebuilds_with_a_new_capture(engine):
    g = engine.add(GEMM(M=32, N=32, K=32))
    engine.bind(g, "A", rng.standard_normal(32 * 32).astype(np.float32))
    engine.bind(g, "B", rng.standard_normal(32 * 32).astype(np.float32))
    engine.wait_ready()
    _run(engine)
    a = rng.standard_normal(96 * 32).astype(np.float32)
    g.set("M", 96)
    engine.bind(g, "A", a)
    b = rng.standard_normal(32 * 32).astype(np.float32)
    engine.bind(g, "B", b)
    _run(engine)
    assert not [d for d in engine.diagnostics(g) if d.severity == "error"]
    ref = a.astype(np.float64).reshape(96, 32) @ b.astype(np.float64).reshape(32, 32)
    np.testing.assert_allclose(engine.read(g, "C").reshape(96, 32), ref, rtol=1e-4, atol=1e-3)


def _assert_dot_products_close(got, a, x):
    """``got == a @ x`` up to float64 rounding in any summation order: each entry within
    ``n * eps * (|a| @ |x|)`` (a relative bound fails entries that nearly cancel)."""
    bound = a.shape[1] * np.finfo(np.float64).eps * (np.abs(a) @ np.abs(x))
    assert np.all(np.abs(got - a @ x) <= bound), np.max(np.abs(got - a @ x) / bound)


def test_gemv_matches_numpy(engine):
    m, n = 300, 77
    a = rng.standard_normal((m, n))
    x = rng.standard_normal(n)
    v = engine.add(GEMV(M=m, N=n, Precision="double", Alpha=2.0))
    engine.bind(v, "A", a.ravel())
    engine.bind(v, "X", x)
    engine.wait_ready()
    _poison(engine, v, "Y")
    _run(engine)
    _assert_dot_products_close(engine.read(v, "Y"), 2.0 * a, x)
    xt = rng.standard_normal(m)
    v.set("Trans", 1)
    engine.bind(v, "X", xt)
    _run(engine)
    _assert_dot_products_close(engine.read(v, "Y"), 2.0 * a.T, xt)


@pytest.mark.parametrize("precision", ["float", "double"])
def test_fft_c2c_forward_and_inverse(engine, precision):
    nx, batch = 240, 7
    cdt = np.complex64 if precision == "float" else np.complex128
    x = (rng.standard_normal((batch, nx)) + 1j * rng.standard_normal((batch, nx))).astype(cdt)
    f = engine.add(FFT(Nx=nx, Precision=precision))
    engine.bind(f, "In", x.view(np.float32 if precision == "float" else np.float64).reshape(-1, 2))
    engine.wait_ready()
    _poison(engine, f, "Out")
    _run(engine)
    got = engine.read(f, "Out").view(cdt).reshape(batch, nx)
    ref = np.fft.fft(x.astype(np.complex128), axis=1)
    tol = 1e-4 if precision == "float" else 1e-12
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())
    f.set("Inverse", 1)  # re-checks shapes and re-captures
    _run(engine)
    got = engine.read(f, "Out").view(cdt).reshape(batch, nx)
    ref = np.fft.ifft(x.astype(np.complex128), axis=1) * nx  # unnormalised, like cuFFT
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_fft_real_and_2d(engine):
    nx, ny, batch = 64, 16, 3
    x = rng.standard_normal((batch, nx)).astype(np.float32)
    r2c = engine.add(FFT(name="r2c", Kind="R2C", Nx=nx))
    engine.bind(r2c, "In", x.ravel())
    c2r = engine.add(FFT(name="c2r", Kind="C2R", Nx=nx))
    engine.connect(r2c, "Out", c2r, "In")
    img = (rng.standard_normal((2, ny, nx)) + 1j * rng.standard_normal((2, ny, nx))).astype(np.complex64)
    f2 = engine.add(FFT(name="2d", Nx=nx, Ny=ny))
    engine.bind(f2, "In", img.view(np.float32).reshape(-1, 2))
    engine.wait_ready()
    for blk in (r2c, c2r, f2):
        _poison(engine, blk, "Out")
    _run(engine)
    spec = engine.read(r2c, "Out").view(np.complex64).reshape(batch, nx // 2 + 1)
    np.testing.assert_allclose(spec, np.fft.rfft(x.astype(np.float64), axis=1), rtol=1e-4, atol=1e-4)
    back = engine.read(c2r, "Out").reshape(batch, nx)
    np.testing.assert_allclose(back, x * nx, rtol=1e-4, atol=1e-3)
    got = engine.read(f2, "Out").view(np.complex64).reshape(2, ny, nx)
    ref = np.fft.fft2(img.astype(np.complex128))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3 * np.abs(ref).max())


def test_random_gives_new_numbers_every_frame(engine):
    r = engine.add(Random(Count=1 << 16))
    engine.wait_ready()
    _run(engine)
    first = engine.read(r, "Out").copy()
    _run(engine)
    second = engine.read(r, "Out")
    assert not np.array_equal(first, second)
    assert 0.0 < first.min() and first.max() <= 1.0 and abs(first.mean() - 0.5) < 0.01
    r.set("Normal", 1)
    r.set("Mean", 3.0)
    r.set("StdDev", 2.0)
    _run(engine)
    z = engine.read(r, "Out").astype(np.float64)
    assert abs(z.mean() - 3.0) < 0.05 and abs(z.std() - 2.0) < 0.05
    recaptures = engine.counters.recaptures
    r.set("StdDev", 0.5)  # a host-mode argument: Recapture, not a rebuild
    _run(engine)
    assert engine.counters.recaptures == recaptures + 1
    assert abs(engine.read(r, "Out").std() - 0.5) < 0.02


@pytest.mark.parametrize("precision", ["float", "double"])
def test_lu_solve_matches_numpy(engine, precision):
    n, nrhs = 50, 3
    dt = np.float32 if precision == "float" else np.float64
    a = (rng.standard_normal((n, n)) + n * np.eye(n)).astype(dt)
    rhs = rng.standard_normal((nrhs, n)).astype(dt)  # NRHS vectors of length N, one after another
    lu = engine.add(LUSolve(N=n, NRHS=nrhs, Precision=precision))
    engine.bind(lu, "A", a.ravel())
    engine.bind(lu, "B", rhs.ravel())
    engine.wait_ready()
    _poison(engine, lu, "X")
    _run(engine, 2)
    x = engine.read(lu, "X").reshape(nrhs, n)
    ref = np.linalg.solve(a.astype(np.float64), rhs.astype(np.float64).T).T
    np.testing.assert_allclose(x, ref, rtol=1e-4 if dt is np.float32 else 1e-11, atol=1e-5)
    assert int(engine.read(lu, "Info")[0]) == 0
    lu_out = engine.read(lu, "LU").reshape(n, n)  # column-major factors of A: L (unit diagonal) and U
    assert np.isfinite(lu_out).all()


def test_spmv_matches_dense_reference(engine):
    rows, cols = 200, 150
    dense = rng.standard_normal((rows, cols)) * (rng.random((rows, cols)) < 0.05)
    offsets = np.concatenate([[0], np.cumsum((dense != 0).sum(axis=1))]).astype(np.int32)
    columns = np.nonzero(dense)[1].astype(np.int32)
    values = dense[dense != 0].astype(np.float32)
    x = rng.standard_normal(cols).astype(np.float32)
    s = engine.add(SpMV(Rows=rows, Cols=cols, Alpha=1.5))
    for port, data in (("RowOffsets", offsets), ("Columns", columns), ("Values", values), ("X", x)):
        engine.bind(s, port, data)
    engine.wait_ready()
    _poison(engine, s, "Y")
    _run(engine)
    np.testing.assert_allclose(engine.read(s, "Y"), 1.5 * dense @ x.astype(np.float64), rtol=1e-4, atol=1e-4)


def _allocating_call(stream, pointers, scalars, libs):
    from cuda.bindings import driver as d

    err, ptr = d.cuMemAllocAsync(1 << 20, stream)  # captured as a memory-allocation node
    assert not err
    d.cuMemsetD32Async(pointers["Out"], 0, scalars["N"], stream)
    d.cuMemFreeAsync(ptr, stream)


def _bad_status_call(stream, pointers, scalars, libs):
    from cudapatch.blocks.captured import nvmath_module

    blas = nvmath_module("cublas")
    h = libs.cublas(stream)
    n = scalars["N"]
    blas.sgemm(
        h, 0, 0, n, n, n, pointers["Out"], pointers["In"], 0, pointers["In"], n, pointers["Out"], pointers["Out"], n
    )


class _CallBlock(Block):
    call = staticmethod(_allocating_call)

    def describe(self, b: BlockBuilder) -> None:
        c = b.add_captured(
            type(self).call,
            CallDescriptor.of(
                "misbehaving", buffer_in("In", "float"), buffer_out("Out", "float"), host_scalar("N", "int")
            ),
        )
        b.input("In", c.in_("In"))
        b.output("Out", c.out("Out"), size=like("In"))
        c.set_count("N", like("In"))


class Allocating(_CallBlock):
    call = staticmethod(_allocating_call)


class BadStatus(_CallBlock):
    call = staticmethod(_bad_status_call)


@pytest.mark.parametrize(
    ("cls", "expect"),
    [(Allocating, "allocates memory"), (BadStatus, "CUBLAS_STATUS_INVALID_VALUE")],
)
def test_a_failing_capture_lands_on_its_block_and_the_rest_runs(engine, cls, expect):
    good = engine.add(Scale(name="good", Factor=3.0))
    x = rng.standard_normal(256).astype(np.float32)
    engine.bind(good, "In", x)
    bad = engine.add(cls(name="bad"))
    engine.bind(bad, "In", x)
    engine.wait_ready()
    _run(engine, 2)
    errors = [d for d in engine.diagnostics(bad) if d.severity == "error"]
    assert errors and expect in errors[0].message and errors[0].code == "library-call", errors
    assert "misbehaving" in errors[0].message and "'bad'" in errors[0].message
    np.testing.assert_allclose(engine.read(good, "Out"), 3.0 * x, rtol=1e-6)
    assert bad.id not in engine.graph.plan.block_order
    # The capture stream was left clean: a good library block still captures.
    g = engine.add(GEMM(M=8, N=8, K=8))
    engine.bind(g, "A", rng.standard_normal(64).astype(np.float32))
    engine.bind(g, "B", rng.standard_normal(64).astype(np.float32))
    _run(engine)
    assert g.id in engine.graph.plan.block_order


def test_library_handles_close_with_the_engine():
    from cudapatch import Engine

    with Engine(wait_for_compile=True) as e:
        g = e.add(GEMM(M=16, N=16, K=16))
        f = e.add(FFT(Nx=64))
        e.bind(g, "A", rng.standard_normal(256).astype(np.float32))
        e.bind(g, "B", rng.standard_normal(256).astype(np.float32))
        e.bind(f, "In", rng.standard_normal((64, 2)).astype(np.float32))
        e.wait_ready()
        e.update()
        libs = e.libraries
        assert libs.scope_count == 2
        e.remove(f)
        e.update()
        e.synchronize()
        e.add(Scale(name="s"))  # the next rebuild reaps the idle old graph and frees the removed call's plan
        e.update()
        assert libs.scope_count == 1
    assert libs.is_closed


def test_debug_launch_replays_captured_calls_node_by_node():
    from cudapatch import Engine

    with Engine(wait_for_compile=True, debug_launch=True) as e:
        pre = e.add(Scale(name="pre", Factor=2.0))
        g = e.add(GEMM(M=16, N=16, K=16))
        a = rng.standard_normal(256).astype(np.float32)
        b = rng.standard_normal(256).astype(np.float32)
        e.bind(pre, "In", a)
        e.bind(g, "B", b)
        e.connect(pre, "Out", g, "A")
        e.wait_ready()
        e.update()
        ref = (2.0 * a.astype(np.float64)).reshape(16, 16) @ b.astype(np.float64).reshape(16, 16)
        np.testing.assert_allclose(e.read(g, "C").reshape(16, 16), ref, rtol=1e-4, atol=1e-3)
