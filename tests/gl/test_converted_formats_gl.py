"""The preview shows images no GL texture holds texel for texel by converting them to floats in the
graph (``formats.conversion_for``, ``gl_writers.GlConvertWriter``): signed 8/16-bit as SNORM into R32F,
bfloat16 and double into R32F, float3 into RGBA32F with alpha 1. The texels are read back from GL and
checked against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch.kernels.types import bfloat16_bits, bfloat16_values
from tests.unit.shape_blocks import Copy

pytestmark = [pytest.mark.gpu, pytest.mark.gl]
GL_SIZE = (160, 90)
H, W = 37, 53  # neither a multiple of the writer's block: the edges must be written too


def _case(type_name: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, str]:
    """``(data bound, texels expected, texture format)`` for one converted type."""
    if type_name in ("char", "short"):
        dt = np.int8 if type_name == "char" else np.int16
        info = np.iinfo(dt)
        data = rng.integers(info.min, info.max, size=(H, W), endpoint=True, dtype=dt)
        data[0, :3] = (info.min, 0, info.max)
        scaled = data.astype(np.float32) / np.float32(info.max)
        return data, np.maximum(scaled, np.float32(-1.0)), "r32f"
    if type_name == "bfloat16":
        data = bfloat16_bits(rng.standard_normal((H, W)) * 100).reshape(H, W)
        return data, bfloat16_values(data).reshape(H, W), "r32f"
    if type_name == "double":
        data = rng.standard_normal((H, W))
        return data, data.astype(np.float32), "r32f"
    data = rng.standard_normal((H, W, 3)).astype(np.float32)  # float3
    return data, np.concatenate([data, np.ones((H, W, 1), np.float32)], axis=2), "rgba32f"


@pytest.mark.parametrize("type_name", ["char", "short", "bfloat16", "double", "float3"])
def test_the_preview_converts_types_without_a_texture(gl_engine, rng: np.random.Generator, type_name: str) -> None:  # noqa: ANN001
    from cudapatch.interop._gl import gl
    from cudapatch.interop.preview import Preview

    engine, ctx = gl_engine
    data, want, fmt = _case(type_name, rng)
    c = engine.add(Copy(name="c", Type=type_name))
    engine.bind(c, "In", data)
    engine.wait_ready()
    engine.update()
    assert engine.read(c, "Out").tobytes() == data.tobytes()
    GL = gl()
    with Preview(engine, ctx, image=(c, "Out"), overlay=False, zero_map=False) as preview:
        tex = preview._texture
        assert tex is not None and tex.format == fmt and (tex.width, tex.height) == (W, H)
        engine.wait_ready()  # the GlConvertWriter the preview added is built
        preview.run(3)
        engine.synchronize()
        GL.glFinish()
        GL.glBindTexture(GL.GL_TEXTURE_2D, tex.gl_name)
        layout = GL.GL_RED if fmt == "r32f" else GL.GL_RGBA
        texels = np.frombuffer(GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, layout, GL.GL_FLOAT), np.float32)
        GL.glBindTexture(GL.GL_TEXTURE_2D, 0)
        assert [d.message for d in engine.diagnostics() if d.severity == "error"] == []
    np.testing.assert_allclose(texels.reshape(want.shape), want, rtol=1e-6, atol=0)


def test_a_type_the_preview_cannot_show_is_a_clear_error(gl_engine) -> None:  # noqa: ANN001
    from cudapatch import Shape
    from cudapatch.engine.buffers import GpuBuffer
    from cudapatch.errors import InteropError
    from cudapatch.interop.preview import Preview
    from cudapatch.kernels.types import DType

    engine, ctx = gl_engine
    c = engine.add(Copy(name="c", Type="uchar4"))
    buf = GpuBuffer(engine.pool, DType.UCHAR4, H * W * 2, stream=engine.device.stream)
    engine.bind(c, "In", buf, shape=Shape.of(H, W, channels=2))
    engine.wait_ready()
    engine.update()
    with pytest.raises(InteropError, match="holds uchar4 x2, which the preview does not show"):
        Preview(engine, ctx, image=(c, "Out"), overlay=False, zero_map=False)
    buf.close()
