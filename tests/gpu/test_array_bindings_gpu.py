"""Arrays of every listed element type bound from CuPy and PyTorch on a real GPU, checked bit for bit
against the data (NumPy); PyTorch's bfloat16 tensors bound as they are (DLPack); mismatched types
refused; Numba kernels over vector-typed arrays (float32x4, uint8x4, float32x3) against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Engine
from cudapatch.errors import BindingError
from tests.unit.shape_blocks import Copy, NumbaLength3, NumbaRgbaInvert, NumbaSwizzle4

from .conftest import random_values

pytestmark = pytest.mark.gpu
TYPES = ["char", "uchar", "short", "ushort", "half", "bfloat16", "float2", "float3", "float4", "uchar4"]


def _round_trip(engine: Engine, block: Copy, array: object) -> bytes:
    engine.bind(block, "In", array)
    engine.update()
    engine.synchronize()
    engine.output(block, "Out").fill_bytes(0xA5)  # poison: an element not copied shows
    engine.update()
    return engine.read(block, "Out").tobytes()


@pytest.mark.parametrize("type_name", TYPES)
def test_cupy_arrays_of_each_type_bind_and_copy_bit_for_bit(
    engine: Engine, rng: np.random.Generator, type_name: str
) -> None:
    cp = pytest.importorskip("cupy")
    data = random_values(type_name, rng, 10_007)
    c = engine.add(Copy(name="c", Type=type_name))
    device = cp.asarray(data)
    cp.cuda.get_current_stream().synchronize()
    assert _round_trip(engine, c, device) == data.tobytes()
    assert engine.context.snapshot().bindings[(c.id, "In")].dtype is c.description.input("In").dtype


def test_cupy_arrays_of_another_type_are_refused(engine: Engine) -> None:
    cp = pytest.importorskip("cupy")
    half = engine.add(Copy(name="half", Type="half"))
    rgba = engine.add(Copy(name="rgba", Type="uchar4"))
    with pytest.raises(BindingError, match="array of float32 bound to a half port, which takes float16 arrays"):
        engine.bind(half, "In", cp.zeros(64, cp.float32))
    with pytest.raises(BindingError, match="array of int8 bound to a uchar4 port"):
        engine.bind(rgba, "In", cp.zeros((8, 4), cp.int8))
    assert not engine.context.snapshot().bindings


def test_a_torch_bfloat16_tensor_binds_as_it_is(engine: Engine) -> None:
    torch = pytest.importorskip("torch")
    bf = engine.add(Copy(name="bf", Type="bfloat16"))
    t = torch.randn(4096, device="cuda", dtype=torch.bfloat16) * 50  # no synchronize: DLPack orders it
    got = _round_trip(engine, bf, t)
    assert got == t.view(torch.int16).cpu().numpy().tobytes()
    img = torch.randn(48, 64, device="cuda", dtype=torch.bfloat16)
    engine.bind(bf, "In", img)
    engine.update()
    assert engine.output_shape(bf, "Out").dims == (48, 64)
    assert engine.read(bf, "Out").tobytes() == img.view(torch.int16).cpu().numpy().tobytes()
    half = engine.add(Copy(name="half", Type="half"))
    with pytest.raises(BindingError, match="array of bfloat16 bound to a half port"):
        engine.bind(half, "In", t)


@pytest.mark.parametrize("type_name", ["char", "uchar", "short", "half", "float4", "uchar4"])
def test_torch_tensors_of_each_type_bind_and_copy_bit_for_bit(
    engine: Engine, rng: np.random.Generator, type_name: str
) -> None:
    torch = pytest.importorskip("torch")
    data = random_values(type_name, rng, 5_003)
    t = torch.from_numpy(data).cuda()
    torch.cuda.synchronize()
    c = engine.add(Copy(name="c", Type=type_name))
    assert _round_trip(engine, c, t) == data.tobytes()
    other_type = "half" if type_name == "float4" else "float2"  # a port of another lane type
    other = engine.add(Copy(name="o", Type=other_type))
    with pytest.raises(BindingError, match=f"bound to a {other_type} port, which takes"):
        engine.bind(other, "In", t)


def test_numba_kernels_over_vector_arrays_match_numpy(engine: Engine, rng: np.random.Generator) -> None:
    pytest.importorskip("numba.cuda")
    n = 3_001
    x4 = rng.standard_normal((n, 4)).astype(np.float32)
    s = engine.add(NumbaSwizzle4(name="swizzle", Gain=1.5))
    engine.bind(s, "In", x4)
    img = rng.integers(0, 255, size=(45, 67, 4), endpoint=True, dtype=np.uint8)
    r = engine.add(NumbaRgbaInvert(name="invert"))
    engine.bind(r, "In", img)
    x3 = rng.standard_normal((n, 3)).astype(np.float32)
    length = engine.add(NumbaLength3(name="length"))
    engine.bind(length, "In", x3)
    engine.update()
    engine.synchronize()
    for block in (s, r, length):
        engine.output(block, "Out").fill_bytes(0xA5)
    engine.update()
    want4 = np.stack([x4[:, 3] * np.float32(1.5), x4[:, 2], x4[:, 1] + x4[:, 0], x4[:, 0]], axis=1)
    np.testing.assert_array_equal(engine.read(s, "Out").reshape(n, 4), want4)
    inverted = img.copy()
    inverted[..., :3] = 255 - img[..., :3]
    np.testing.assert_array_equal(engine.read(r, "Out").reshape(img.shape), inverted)
    np.testing.assert_allclose(engine.read(length, "Out"), np.linalg.norm(x3.astype(np.float64), axis=1), rtol=1e-6)
    assert not [d for d in engine.diagnostics() if d.severity == "error"]
