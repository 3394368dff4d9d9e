"""Runtime kernels on a real GPU: NVRTC and Numba sources, the Code tier's in-place swap, compile
errors that keep the old kernel running, live reload of kernel files, and the cubin cache."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from cudapatch import BlockState, CustomKernel, Engine, KernelFile
from cudapatch.kernels import bundled_kernel

from .conftest import run_until

pytestmark = pytest.mark.gpu

GAIN = """extern "C" __global__ void k(const float* in, float* out, float gain, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * gain;
}
"""


def _rand(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def test_code_edit_swaps_kernel_without_reinstantiation(live_engine: Engine, rng: np.random.Generator) -> None:
    e = live_engine
    x = _rand(rng, 10_000)
    ck = e.add(CustomKernel(name="ck", Code=GAIN, gain=2.0))
    e.bind(ck, "in", x)
    run_until(e, lambda: ck.debug.state is BlockState.OK)
    np.testing.assert_allclose(e.read(ck, "out"), 2.0 * x.astype(np.float64), rtol=1e-6)
    graph, rebuilds = e.graph, e.counters.rebuilds
    ck.set("Code", GAIN.replace("in[i] * gain", "in[i] * gain + 1.0f"))  # same signature: Code tier
    assert graph.node_arg(0, 2) == 2.0
    run_until(e, lambda: e.counters.code_swaps == 1)
    e.update()
    assert e.graph is graph and graph.instantiations == 1 and e.counters.rebuilds == rebuilds
    np.testing.assert_allclose(e.read(ck, "out"), 2.0 * x.astype(np.float64) + 1.0, rtol=1e-6, atol=1e-6)
    assert ck.debug.state is BlockState.OK


def test_signature_change_rebuilds_with_new_ports(live_engine: Engine, rng: np.random.Generator) -> None:
    e = live_engine
    x = _rand(rng, 1000)
    ck = e.add(CustomKernel(name="ck", Code=GAIN, gain=3.0))
    e.bind(ck, "in", x)
    run_until(e, lambda: ck.debug.state is BlockState.OK)
    rebuilds = e.counters.rebuilds
    ck.set("Code", GAIN.replace("float gain,", "float gain, float bias,").replace("* gain", "* gain + bias"))
    ck.set("bias", 0.5)
    assert "bias" in ck.params and ck.get("gain") == 3.0  # values survive the re-description
    run_until(e, lambda: e.counters.rebuilds > rebuilds and ck.debug.state is BlockState.OK)
    np.testing.assert_allclose(e.read(ck, "out"), 3.0 * x.astype(np.float64) + 0.5, rtol=1e-6, atol=1e-6)


def test_compile_error_keeps_old_kernel_and_fix_clears_it(live_engine: Engine, rng: np.random.Generator) -> None:
    e = live_engine
    x = _rand(rng, 512)
    ck = e.add(CustomKernel(name="ck", Code=GAIN, gain=-1.0))
    e.bind(ck, "in", x)
    run_until(e, lambda: ck.debug.state is BlockState.OK)
    broken = GAIN.replace("out[i] = in[i] * gain;", "out[i] = in[i] * gain + undefined_thing;")
    ck.set("Code", broken)
    run_until(e, lambda: ck.debug.state is BlockState.ERROR)
    diag = next(d for d in e.diagnostics(ck) if d.code == "kernel-compile")
    assert "undefined_thing" in diag.message and "ck.cu:4" in diag.message and "keeps running" in diag.message
    e.update()
    np.testing.assert_allclose(e.read(ck, "out"), -x.astype(np.float64), rtol=1e-6)  # the old kernel runs
    ck.set("Code", GAIN.replace("in[i] * gain", "in[i] * gain * 2.0f"))
    run_until(e, lambda: ck.debug.state is BlockState.OK and e.counters.code_swaps >= 1)
    e.update()
    np.testing.assert_allclose(e.read(ck, "out"), -2.0 * x.astype(np.float64), rtol=1e-6)
    assert not e.diagnostics(ck)


def test_cu_file_and_include_edits_go_live(live_engine: Engine, rng: np.random.Generator, tmp_path: Path) -> None:
    e = live_engine
    (tmp_path / "op.h").write_text("__device__ float op(float v) { return v * 2.0f; }\n")
    cu = tmp_path / "k.cu"
    cu.write_text('#include "op.h"\n' + GAIN.replace("in[i] * gain", "op(in[i]) * gain"))
    x = _rand(rng, 2048)
    kf = e.add(KernelFile(cu, name="kf"))
    e.bind(kf, "in", x)
    run_until(e, lambda: kf.debug.state is BlockState.OK)
    np.testing.assert_allclose(e.read(kf, "out"), 2.0 * x.astype(np.float64), rtol=1e-6)
    cu.write_text('#include "op.h"\n' + GAIN.replace("in[i] * gain", "op(in[i]) * gain - 1.0f"))
    frames = run_until(e, lambda: e.counters.code_swaps == 1, timeout=20)
    e.update()
    np.testing.assert_allclose(e.read(kf, "out"), 2.0 * x.astype(np.float64) - 1.0, rtol=1e-6, atol=1e-6)
    (tmp_path / "op.h").write_text("__device__ float op(float v) { return v * 3.0f; }\n")
    run_until(e, lambda: e.counters.code_swaps == 2, timeout=20)
    e.update()
    np.testing.assert_allclose(e.read(kf, "out"), 3.0 * x.astype(np.float64) - 1.0, rtol=1e-6, atol=1e-6)
    assert frames > 0


def test_ptx_edit_with_new_signature_rebuilds(live_engine: Engine, rng: np.random.Generator, tmp_path: Path) -> None:
    e = live_engine
    fill, scale = bundled_kernel("fill"), bundled_kernel("scale")
    ptx, side = tmp_path / "k.ptx", tmp_path / "k.json"
    shutil.copy(fill.ptx_path, ptx)
    shutil.copy(fill.sidecar_path, side)
    kf = e.add(KernelFile(ptx, name="kf", Count=300, value=4.5))
    run_until(e, lambda: kf.debug.state is BlockState.OK)
    np.testing.assert_array_equal(e.read(kf, "out"), np.full(300, 4.5, np.float32))
    rebuilds = e.counters.rebuilds
    shutil.copy(scale.sidecar_path, side)  # half an edit: the sidecar no longer matches the PTX
    shutil.copy(scale.ptx_path, ptx)
    run_until(e, lambda: "in" in [p.name for p in kf.inputs], timeout=20)
    x = _rand(rng, 64)
    e.bind(kf, "in", x)
    kf.set("factor", 2.0)
    run_until(e, lambda: e.counters.rebuilds > rebuilds and kf.debug.state is BlockState.OK, timeout=20)
    np.testing.assert_allclose(e.read(kf, "out"), 2.0 * x.astype(np.float64) + 1.0, rtol=1e-6, atol=1e-6)


def test_deleted_kernel_file_keeps_running(live_engine: Engine, rng: np.random.Generator, tmp_path: Path) -> None:
    e = live_engine
    cu = tmp_path / "k.cu"
    cu.write_text(GAIN)
    kf = e.add(KernelFile(cu, name="kf", gain=5.0))
    x = _rand(rng, 100)
    e.bind(kf, "in", x)
    run_until(e, lambda: kf.debug.state is BlockState.OK)
    cu.unlink()
    run_until(e, lambda: kf.debug.state is BlockState.ERROR, timeout=20)
    assert "not found" in kf.debug.message
    e.update()
    np.testing.assert_allclose(e.read(kf, "out"), 5.0 * x.astype(np.float64), rtol=1e-6)


def test_second_engine_hits_the_disk_cache(tmp_path: Path, rng: np.random.Generator) -> None:
    x = _rand(rng, 64)
    code = GAIN.replace("in[i] * gain", "in[i] * gain + 7.0f")
    for expected in ("compiled", "disk"):
        with Engine(cache_dir=tmp_path, wait_for_compile=True) as e:
            ck = e.add(CustomKernel(name="ck", Code=code))
            e.bind(ck, "in", x)
            e.update()
            slot = e.kernels._slots[(ck.id, 0)]
            assert slot.good is not None and slot.good.origin == expected
            np.testing.assert_allclose(e.read(ck, "out"), x.astype(np.float64) + 7.0, rtol=1e-6)
    # The kernel's entry (the engine's own copy kernels are cached beside it): corrupt, detected and rebuilt.
    (entry,) = [p for p in tmp_path.glob("*.cubin") if b'"symbol": "k"' in p.read_bytes()[:4096]]
    entry.write_bytes(entry.read_bytes()[:100])
    with Engine(cache_dir=tmp_path, wait_for_compile=True) as e:
        ck = e.add(CustomKernel(name="ck", Code=code))
        e.bind(ck, "in", x)
        e.update()
        assert e.kernel_cache.corrupt == 1 and e.kernels._slots[(ck.id, 0)].good.origin == "compiled"
        np.testing.assert_allclose(e.read(ck, "out"), x.astype(np.float64) + 7.0, rtol=1e-6)


def test_update_never_waits_for_a_compile(live_engine: Engine, rng: np.random.Generator) -> None:
    e = live_engine
    x = _rand(rng, 256)
    ck = e.add(CustomKernel(name="ck", Code=GAIN))
    e.bind(ck, "in", x)
    run_until(e, lambda: ck.debug.state is BlockState.OK)
    times = []
    for i in range(20):  # a burst of distinct edits, none cached
        ck.set("Code", GAIN.replace("in[i] * gain", f"in[i] * gain + {i}.0f"))
        t = time.perf_counter()
        e.update()
        times.append(time.perf_counter() - t)
    assert max(times) < 0.010, f"slowest update during the burst: {max(times) * 1e3:.1f} ms"
    run_until(e, lambda: not e.kernels.pending)
    e.update()
    np.testing.assert_allclose(e.read(ck, "out"), x.astype(np.float64) + 19.0, rtol=1e-6, atol=1e-6)
