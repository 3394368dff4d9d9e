"""The preview shows any 2-D output as an image, sized from its shape, in the texture format of its
element type: RGBA8 (uchar4), RGBA32F (float4) and a grey R32F (float)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.gl]
GL_SIZE = (320, 180)  # gl_engine's context (conftest): the images below fill it


@pytest.mark.parametrize("fmt", ["rgba8", "rgba32f"])
def test_the_preview_shows_an_image_block_at_its_shape(gl_engine, fmt: str) -> None:  # noqa: ANN001
    from cudapatch.blocks.library import Pattern
    from cudapatch.interop.preview import Preview

    engine, ctx = gl_engine
    p = engine.add(Pattern(name="p", Format=fmt, Width=320, Height=180, Time=0.5))
    engine.wait_ready()
    engine.update()
    with Preview(engine, ctx, image=(p, "Out"), overlay=False) as preview:
        assert preview.image[2:] == (320, 180)
        preview.run(3)
        preview.frame()
        shown = ctx.read_pixels().astype(int)
    want = engine.read(p, "Out")
    want = want.astype(int) if fmt == "rgba8" else np.clip(np.floor(want * 255 + 0.5), 0, 255).astype(int)
    # GL rows go bottom-up in read_pixels when the renderer flips; compare in whichever order matches.
    err = min(np.abs(shown - want).max(), np.abs(shown[::-1] - want).max())
    assert err <= 2, err


def test_a_float_image_shows_grey(gl_engine) -> None:  # noqa: ANN001
    from cudapatch.interop.preview import Preview
    from tests.unit.shape_blocks import Gain2D

    engine, ctx = gl_engine
    g = engine.add(Gain2D(name="g", Gain=1.0))
    ramp = np.tile(np.linspace(0.0, 1.0, 320, dtype=np.float32), (180, 1))
    engine.bind(g, "In", ramp)
    engine.wait_ready()
    engine.update()
    with Preview(engine, ctx, image=(g, "Out"), overlay=False, zero_map=False) as preview:
        assert preview._texture is not None and preview._texture.format == "r32f"
        preview.run(3)
        preview.frame()
        shown = ctx.read_pixels().astype(int)
    x = np.floor(np.linspace(0.0, 1.0, 320) * 255 + 0.5)
    assert np.abs(shown[90, :, 0] - x).max() <= 2
    assert (shown[..., 0] == shown[..., 1]).all() and (shown[..., 1] == shown[..., 2]).all()  # grey
