"""Pinned values under buffer reuse on a real GPU (chains unfused, ``fuse=False``: fused, a chain is one
kernel with no intermediate buffers to share): a probed intermediate of a reusing chain keeps its own
buffer, so its probe reads its values and not those of a later block written into a shared buffer;
an intermediate the preview shows reaches GL with its own values. (The pins in the plan are
unit-tested: tests/unit/test_reuse_pins.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Block, Engine, Scale
from cudapatch.engine.memory_plan import PinReason

from .conftest import run_until

pytestmark = pytest.mark.gpu

# Far apart offsets: each block's values lie in a range of their own, so statistics of another
# block's values (a shared buffer overwritten after the probed block ran) could not pass for them.
FACTORS = [1.5, -0.5, 2.0, 0.75, -1.25, 1.1, 0.9, -2.0, 1.3, 0.6]
OFFSETS = [100.0 * (i + 1) for i in range(len(FACTORS))]


def _chain(e: Engine, x: np.ndarray) -> list[Block]:
    blocks: list[Block] = []
    for i, (f, o) in enumerate(zip(FACTORS, OFFSETS, strict=True)):
        s = e.add(Scale(name=f"s{i}", Factor=f, Offset=o))
        if blocks:
            e.connect(blocks[-1], "Out", s, "In")
        else:
            e.bind(s, "In", x)
        blocks.append(s)
    return blocks


def _chain_ref(x: np.ndarray, upto: int) -> np.ndarray:
    """Block ``upto``'s output in float64 (the kernels round each step to float32: compared with rtol)."""
    y = x.astype(np.float64)
    for f, o in zip(FACTORS[: upto + 1], OFFSETS[: upto + 1], strict=True):
        y = y * f + o
    return y


def test_a_probed_intermediate_of_a_reusing_chain_reads_its_own_values(
    unfused_engine: Engine, rng: np.random.Generator
) -> None:
    engine = unfused_engine
    x = rng.standard_normal(1 << 18).astype(np.float32)
    blocks = _chain(engine, x)
    mid = 4
    probe = engine.probe(blocks[mid], "Out")
    engine.wait_ready()
    run_until(engine, lambda: probe.stats is not None)
    plan = engine.graph.plan
    mem = plan.memory
    vi = mem.ports[(blocks[mid].id, "Out")]
    assert (vi, PinReason.PROBE) in mem.pinned and not mem.shared(mem.value_buffer[vi])
    assert mem.buffer_values()  # the rest of the chain shares: the probed value is pinned amid reuse
    assert mem.shared(mem.value_buffer[mem.ports[(blocks[mid + 1].id, "Out")]])
    first = engine.counters.frames
    run_until(engine, lambda: probe.stats is not None and probe.stats.frame >= first)  # a frame of this graph
    want = _chain_ref(x, mid)
    st = probe.stats
    assert st.values == x.size and st.nan == 0 and st.inf == 0
    assert st.minimum == pytest.approx(want.min(), rel=1e-5)
    assert st.maximum == pytest.approx(want.max(), rel=1e-5)
    assert st.mean == pytest.approx(want.mean(), rel=1e-5)
    # the buffer itself, read after the frame: the probed block's values, and the chain's end is right
    np.testing.assert_allclose(engine.read(blocks[mid], "Out"), want, rtol=1e-5)
    np.testing.assert_allclose(engine.read(blocks[-1], "Out"), _chain_ref(x, len(FACTORS) - 1), rtol=1e-4)


@pytest.mark.gl  # the preview's texture lives in a (headless EGL) GL context
def test_an_intermediate_the_preview_shows_keeps_its_buffer_and_gl_gets_its_values(
    unfused_engine: Engine, rng: np.random.Generator
) -> None:
    from cudapatch.blocks.library import Blur, ColorMap, Threshold
    from cudapatch.interop import EglContext
    from cudapatch.interop._gl import gl
    from cudapatch.interop.preview import Preview

    engine = unfused_engine
    h, w = 48, 64
    img = rng.random((h, w, 4), dtype=np.float32)

    def chain(e: Engine) -> list[Block]:
        blocks = [
            e.add(Blur(name="blur", Format="rgba32f", Radius=3, Sigma=1.5)),
            e.add(ColorMap(name="map", Format="rgba32f", Low=0.2, High=0.8)),  # shown
            e.add(Blur(name="blur2", Format="rgba32f", Radius=2, Sigma=1.0)),
            e.add(Threshold(name="level", Format="rgba32f", Level=0.4)),
            e.add(ColorMap(name="map2", Format="rgba32f", Low=0.1, High=0.9)),
        ]
        e.bind(blocks[0], "In", img)
        for a, b in zip(blocks, blocks[1:], strict=False):
            e.connect(a, "Out", b, "In")
        return blocks

    shown = chain(engine)[1]
    engine.wait_ready()
    engine.update()
    ctx = EglContext(w, h)
    try:
        engine.device.make_current()
        GL = gl()
        with Preview(engine, ctx, image=(shown, "Out"), overlay=False, zero_map=False) as preview:
            engine.wait_ready()  # the rebuild that keeps the shown output
            preview.run(3)
            mem = engine.graph.plan.memory
            vi = mem.ports[(shown.id, "Out")]
            assert (vi, PinReason.KEEP) in mem.pinned and not mem.shared(mem.value_buffer[vi])
            assert mem.buffer_values()  # the other images still take turns in shared buffers
            engine.synchronize()
            GL.glFinish()
            tex = preview._texture
            assert tex is not None and (tex.width, tex.height) == (w, h)
            GL.glBindTexture(GL.GL_TEXTURE_2D, tex.gl_name)
            texels = np.frombuffer(GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA, GL.GL_FLOAT), np.float32)
            GL.glBindTexture(GL.GL_TEXTURE_2D, 0)
            got = engine.read(shown, "Out")
        assert [d.message for d in engine.diagnostics() if d.severity == "error"] == []
    finally:
        ctx.close()
    with Engine(wait_for_compile=True, fuse=False, reuse_buffers=False) as plain:  # the same chain, no reuse
        again = chain(plain)
        plain.update()
        want = plain.read(again[1], "Out")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(texels.reshape(want.shape), want)
