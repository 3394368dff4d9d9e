"""Shapes on the GPU: 2-D and 3-D launches against NumPy, every new element type round-tripped through
CUDA C++ and Numba kernels and bound from NumPy, CuPy and PyTorch, and planted short or mis-shaped
inputs that never launch (run in their own process: were one launched, it would fault)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cudapatch import BlockState, Engine, Scale, Shape
from tests.unit.shape_blocks import Copy, Gain2D, NumbaCopy, NumbaGain2D, Ramp2D, Ramp3D, Transpose2D

from .conftest import random_values

pytestmark = pytest.mark.gpu
SCENARIO = Path(__file__).with_name("short_input_scenario.py")
ROOT = Path(__file__).resolve().parents[2]


def _ramp(h: int, w: int) -> np.ndarray:
    return np.arange(w, dtype=np.float64)[None, :] + 1000.0 * np.arange(h, dtype=np.float64)[:, None]


# -- 2-D and 3-D launches ---------------------------------------------------------------------------
def test_a_2d_kernel_over_a_bound_image_matches_numpy(engine: Engine, rng: np.random.Generator) -> None:
    h, w = 301, 517  # neither a multiple of 16: the edge blocks must stop at the border
    img = rng.standard_normal((h, w)).astype(np.float32)
    g = engine.add(Gain2D(name="g", Gain=-1.5))
    s = engine.add(Scale(name="s", Factor=2.0, Offset=0.5))  # a 1-D block after it keeps the shape
    engine.connect(g, "Out", s, "In")
    engine.bind(g, "In", img)
    engine.update()
    engine.synchronize()
    engine.output(g, "Out").fill_bytes(0xFF)  # poison: NaN where a pixel is not written
    engine.update()
    got = engine.read(g, "Out")
    assert got.shape == (h, w) and engine.output_shape(s, "Out") == Shape.of(h, w)
    np.testing.assert_allclose(got, img.astype(np.float64) * -1.5, rtol=1e-6)
    np.testing.assert_allclose(engine.read(s, "Out"), img.astype(np.float64) * -3.0 + 0.5, rtol=1e-5, atol=1e-5)
    (node,) = [n for n in engine.graph.plan.kernel_nodes if n.block_id == g.id]
    assert (node.grid, node.yz) == (33, (19, 1, 16, 1))


def test_2d_and_3d_sources_and_a_computed_transpose_match_numpy(engine: Engine) -> None:
    r2 = engine.add(Ramp2D(name="r2", Width=130, Height=77))
    t = engine.add(Transpose2D(name="t", Width=130, Height=77))
    r3 = engine.add(Ramp3D(name="r3", Width=19, Height=10, Depth=9))
    engine.connect(r2, "Out", t, "In")
    engine.update()
    engine.synchronize()
    for blk, port in ((r2, "Out"), (t, "Out"), (r3, "Out")):
        engine.output(blk, port).fill_bytes(0xFF)
    engine.update()
    ref = _ramp(77, 130)
    np.testing.assert_array_equal(engine.read(r2, "Out"), ref)
    np.testing.assert_array_equal(engine.read(t, "Out"), ref.T)
    z, y, x = np.meshgrid(np.arange(9), np.arange(10), np.arange(19), indexing="ij")
    np.testing.assert_array_equal(engine.read(r3, "Out"), x + 100.0 * y + 10000.0 * z)


def test_a_numba_2d_kernel_gets_width_and_height_from_the_shape(engine: Engine, rng: np.random.Generator) -> None:
    pytest.importorskip("numba.cuda")
    h, w = 45, 131  # neither a multiple of 16
    img = rng.standard_normal((h, w)).astype(np.float32)
    g = engine.add(NumbaGain2D(name="g", Gain=0.75))
    engine.bind(g, "In", img)
    engine.wait_ready()
    engine.update()
    engine.synchronize()
    engine.output(g, "Out").fill_bytes(0xFF)  # poison: NaN where a pixel is not written
    engine.update()
    got = engine.read(g, "Out")
    assert got.shape == (h, w)
    np.testing.assert_allclose(got, img.astype(np.float64) * 0.75, rtol=1e-6)


def test_a_resized_image_relaunches_over_the_new_axes(engine: Engine, rng: np.random.Generator) -> None:
    g = engine.add(Gain2D(name="g", Gain=3.0))
    for h, w in ((64, 64), (100, 37), (37, 100)):  # the last two have the same count, other axes
        img = rng.standard_normal((h, w)).astype(np.float32)
        engine.bind(g, "In", img)
        engine.update()
        engine.synchronize()
        engine.output(g, "Out").fill_bytes(0xFF)
        engine.update()
        np.testing.assert_allclose(engine.read(g, "Out"), img.astype(np.float64) * 3.0, rtol=1e-6)


def test_cupy_and_torch_images_bind_with_their_shape(engine: Engine, rng: np.random.Generator) -> None:
    cp = pytest.importorskip("cupy")
    img = rng.standard_normal((90, 160)).astype(np.float32)
    g = engine.add(Gain2D(name="g", Gain=0.5))
    engine.bind(g, "In", cp.asarray(img))
    cp.cuda.get_current_stream().synchronize()
    engine.update()
    np.testing.assert_allclose(engine.read(g, "Out"), img * 0.5, rtol=1e-6)
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(img.T.copy()).cuda()  # 160 x 90
    torch.cuda.synchronize()
    engine.bind(g, "In", t)
    engine.update()
    np.testing.assert_allclose(engine.read(g, "Out"), img.T * 0.5, rtol=1e-6)


# -- element types ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "type_name", ["char", "uchar", "short", "ushort", "half", "bfloat16", "float2", "float3", "float4", "uchar4"]
)
def test_every_new_type_round_trips_through_cuda_cpp(engine: Engine, rng: np.random.Generator, type_name: str) -> None:
    n = 10_007
    data = random_values(type_name, rng, n)
    c = engine.add(Copy(name="c", Type=type_name))
    engine.bind(c, "In", data)
    engine.update()
    engine.synchronize()
    engine.output(c, "Out").fill_bytes(0xA5)
    engine.update()
    got = engine.read(c, "Out")
    assert got.tobytes() == np.ascontiguousarray(data).tobytes()  # bit for bit


@pytest.mark.parametrize("type_name", ["int8", "uint8", "int16", "uint16", "float16"])
def test_8_and_16_bit_types_round_trip_through_numba(engine: Engine, rng: np.random.Generator, type_name: str) -> None:
    pytest.importorskip("numba.cuda")
    n = 5_003
    dt = np.dtype(type_name)
    data = (
        rng.standard_normal(n).astype(dt)
        if dt.kind == "f"
        else rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, size=n, endpoint=True, dtype=dt)
    )
    c = engine.add(NumbaCopy(name="nb", Type=type_name))
    engine.bind(c, "In", data)
    engine.update()
    engine.synchronize()
    engine.output(c, "Out").fill_bytes(0xA5)
    engine.update()
    assert engine.read(c, "Out").tobytes() == data.tobytes()


def test_half_and_bfloat16_bind_from_cupy_and_torch(engine: Engine, rng: np.random.Generator) -> None:
    cp = pytest.importorskip("cupy")
    half = engine.add(Copy(name="half", Type="half"))
    data = rng.standard_normal(4096).astype(np.float16)
    engine.bind(half, "In", cp.asarray(data))
    cp.cuda.get_current_stream().synchronize()
    engine.update()
    assert engine.read(half, "Out").tobytes() == data.tobytes()
    torch = pytest.importorskip("torch")
    bf = engine.add(Copy(name="bf", Type="bfloat16"))
    t = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    engine.bind(bf, "In", t.view(torch.int16))  # PyTorch exports no bfloat16 array interface: its bits
    engine.update()
    got = engine.read(bf, "Out")
    assert got.tobytes() == t.view(torch.int16).cpu().numpy().tobytes()


# -- planted short inputs ---------------------------------------------------------------------------
def test_a_short_input_is_an_error_and_the_rest_keeps_running(engine: Engine, rng: np.random.Generator) -> None:
    from cudapatch import VectorAdd

    a, b = rng.standard_normal(4096).astype(np.float32), rng.standard_normal(4096).astype(np.float32)
    add = engine.add(VectorAdd(name="add"))
    other = engine.add(Scale(name="other", Factor=2.0))
    engine.bind(add, "A", a)
    engine.bind(add, "B", b)
    engine.bind(other, "In", a)
    engine.update()
    np.testing.assert_allclose(engine.read(add, "Sum"), a + b, rtol=1e-6)
    engine.bind(add, "B", b[:4000])  # planted: 96 elements short
    for _ in range(3):
        engine.update()
    engine.synchronize()
    assert add.debug.state is BlockState.ERROR and "input 'B' holds 4000 elements but needs 4096" in str(add)
    assert [d.code for d in engine.diagnostics() if d.block_id == add.id] == ["input-short"]
    np.testing.assert_allclose(engine.read(other, "Out"), a * 2.0, rtol=1e-6)
    assert engine.counters.faults == 0
    engine.bind(add, "B", b)  # fixed: it runs again
    engine.update()
    np.testing.assert_allclose(engine.read(add, "Sum"), a + b, rtol=1e-6)


@pytest.mark.gpu_fault
def test_planted_inputs_at_illegal_addresses_never_launch() -> None:
    # Short and mis-shaped inputs whose memory is an illegal address: a launch would fault, so the
    # scenario runs in its own process (a fault costs the whole process its CUDA use).
    out = subprocess.run([sys.executable, str(SCENARIO)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout + out.stderr
