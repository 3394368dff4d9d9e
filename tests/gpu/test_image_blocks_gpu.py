"""The image blocks on the GPU, each against a NumPy reference, in RGBA8 and RGBA32F.

RGBA8 results may differ from the reference by one step (the kernels work in float32 with fast
``__expf``/``__sinf``; the reference in float64, rounded where the kernels store bytes)."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Engine
from cudapatch.blocks.library import Blur, ColorMap, Mix, Pattern, Resample, Threshold

pytestmark = pytest.mark.gpu
FORMATS = ["rgba8", "rgba32f"]


def _image(rng: np.random.Generator, fmt: str, h: int, w: int) -> np.ndarray:
    if fmt == "rgba8":
        return rng.integers(0, 255, size=(h, w, 4), endpoint=True, dtype=np.uint8)
    return rng.random((h, w, 4), dtype=np.float32)


def _load(img: np.ndarray) -> np.ndarray:
    """Pixels as the kernels load them: 0..1 floats."""
    return img.astype(np.float64) / 255.0 if img.dtype == np.uint8 else img.astype(np.float64)


def _store(v: np.ndarray, fmt: str) -> np.ndarray:
    """Floats as the kernels store them (RGBA8: rounded half up, clamped)."""
    if fmt == "rgba8":
        return np.clip(np.floor(v * 255.0 + 0.5), 0, 255).astype(np.uint8)
    return v.astype(np.float32)


def _close(got: np.ndarray, ref: np.ndarray, fmt: str, atol32: float = 1e-5) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype
    if fmt == "rgba8":
        diff = np.abs(got.astype(np.int32) - ref.astype(np.int32))
        assert diff.max() <= 1, f"{np.count_nonzero(diff > 1)} bytes off by more than 1"
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=atol32)


def _run(engine: Engine, block, port: str = "Out") -> np.ndarray:  # noqa: ANN001
    engine.update()
    engine.synchronize()
    engine.output(block, port).fill_bytes(0xA5)  # poison: unwritten pixels show
    engine.update()
    return engine.read(block, port)


def _luma(c: np.ndarray) -> np.ndarray:
    return 0.2126 * c[..., 0] + 0.7152 * c[..., 1] + 0.0722 * c[..., 2]


@pytest.mark.parametrize("fmt", FORMATS)
def test_pattern(engine: Engine, fmt: str) -> None:
    h, w, t = 181, 333, 1.7
    p = engine.add(Pattern(name="p", Format=fmt, Width=w, Height=h, Time=t))
    got = _run(engine, p)
    u, v = np.meshgrid(np.arange(w) / w, np.arange(h) / h)
    cx, cy = u - 0.5 - 0.25 * np.cos(0.9 * t), v - 0.5 - 0.25 * np.sin(1.1 * t)
    spot = np.exp(-(cx * cx + cy * cy) * 60.0)
    rgb = [
        0.5 + 0.5 * np.sin(12.0 * u + t),
        0.5 + 0.5 * np.sin(9.0 * v - 1.3 * t),
        0.5 + 0.5 * np.sin(7.0 * (u + v) + 0.7 * t),
    ]
    ref = np.stack([np.minimum(c + spot, 1.0) for c in rgb] + [np.ones_like(u)], axis=-1)
    _close(got, _store(ref, fmt), fmt, atol32=2e-3)  # __sinf, __expf


def _blur_ref(img: np.ndarray, fmt: str, radius: int, sigma: float) -> np.ndarray:
    k = np.arange(radius + 1)
    wk = np.exp(-0.5 * k * k / sigma**2)
    wk /= wk[0] + 2.0 * wk[1:].sum()
    h, w = img.shape[:2]

    def one_pass(x: np.ndarray, axis: int, n: int) -> np.ndarray:
        acc = x * wk[0]
        for j in range(1, radius + 1):
            lo = np.clip(np.arange(n) - j, 0, n - 1)
            hi = np.clip(np.arange(n) + j, 0, n - 1)
            acc = acc + (np.take(x, lo, axis=axis) + np.take(x, hi, axis=axis)) * wk[j]
        return acc

    tmp = _store(one_pass(_load(img), 1, w), fmt)  # the horizontal pass is stored as pixels
    return _store(one_pass(_load(tmp), 0, h), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("radius", "sigma"), [(0, 1.0), (3, 1.5), (12, 5.0)])
def test_blur(engine: Engine, rng: np.random.Generator, fmt: str, radius: int, sigma: float) -> None:
    img = _image(rng, fmt, 97, 203)
    b = engine.add(Blur(name="b", Format=fmt, Radius=radius, Sigma=sigma))
    engine.bind(b, "In", img)
    _close(_run(engine, b), _blur_ref(img, fmt, radius, sigma), fmt)
    b.set("Radius", 7)  # Hot: no rebuild, new weights next frame
    rebuilds = engine.counters.rebuilds
    _close(_run(engine, b), _blur_ref(img, fmt, 7, sigma), fmt)
    assert engine.counters.rebuilds == rebuilds


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("h", "w"), [(50, 70), (301, 123)])  # shrink, and grow one axis
def test_resample(engine: Engine, rng: np.random.Generator, fmt: str, h: int, w: int) -> None:
    img = _image(rng, fmt, 120, 160)
    r = engine.add(Resample(name="r", Format=fmt, Width=w, Height=h))
    engine.bind(r, "In", img)
    got = _run(engine, r)
    src = _load(img)
    ih, iw = img.shape[:2]
    sx = np.maximum((np.arange(w) + 0.5) * iw / w - 0.5, 0.0)
    sy = np.maximum((np.arange(h) + 0.5) * ih / h - 0.5, 0.0)
    x0, y0 = np.minimum(sx.astype(int), iw - 1), np.minimum(sy.astype(int), ih - 1)
    x1, y1 = np.minimum(x0 + 1, iw - 1), np.minimum(y0 + 1, ih - 1)
    fx, fy = (sx - x0)[None, :, None], (sy - y0)[:, None, None]
    top = src[y0][:, x0] * (1 - fx) + src[y0][:, x1] * fx
    bottom = src[y1][:, x0] * (1 - fx) + src[y1][:, x1] * fx
    _close(got, _store(top * (1 - fy) + bottom * fy, fmt), fmt, atol32=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_threshold_colormap_and_mix(engine: Engine, rng: np.random.Generator, fmt: str) -> None:
    img = _image(rng, fmt, 64, 96)
    other = _image(rng, fmt, 64, 96)
    thr = engine.add(Threshold(name="thr", Format=fmt, Level=0.45))
    cmap = engine.add(ColorMap(name="cmap", Format=fmt, Low=0.2, High=0.8))
    mix = engine.add(Mix(name="mix", Format=fmt, Amount=0.3))
    engine.bind(thr, "In", img)
    engine.bind(cmap, "In", img)
    engine.bind(mix, "A", img)
    engine.bind(mix, "B", other)
    engine.update()
    src = _load(img)
    luma = _luma(src)

    got = _run(engine, thr)
    v = (luma > 0.45).astype(np.float64)
    ref = _store(np.stack([v, v, v, src[..., 3]], axis=-1), fmt)
    far = np.abs(luma - 0.45) > 1e-5  # pixels at the level itself may go either way in float32
    _close(got[far], ref[far], fmt)

    t = np.clip((luma - 0.2) / 0.6, 0.0, 1.0)
    poly = {
        0: (0.13572138, 4.61539260, -42.66032258, 132.13108234, -152.94239396, 59.28637943),
        1: (0.09140261, 2.19418839, 4.84296658, -14.18503333, 4.27729857, 2.82956604),
        2: (0.10667330, 12.64194608, -60.58204836, 110.36276771, -89.90310912, 27.34824973),
    }
    rgb = [np.clip(sum(c * t**p for p, c in enumerate(poly[ch])), 0.0, 1.0) for ch in range(3)]
    _close(_run(engine, cmap), _store(np.stack([*rgb, src[..., 3]], axis=-1), fmt), fmt, atol32=1e-4)

    _close(_run(engine, mix), _store(src * 0.7 + _load(other) * 0.3, fmt), fmt)


def test_blur_4k_rgba8_matches_cupyx_ndimage(engine: Engine, rng: np.random.Generator) -> None:
    # The benchmark's peer computes the same image (bench_image.py compares their speed).
    cp = pytest.importorskip("cupy")
    ndimage = pytest.importorskip("cupyx.scipy.ndimage")
    img = _image(rng, "rgba8", 2160, 3840)
    b = engine.add(Blur(name="b", Radius=8, Sigma=2.0))
    engine.bind(b, "In", img)
    got = _run(engine, b)
    x = cp.asarray(img)
    peer = ndimage.gaussian_filter1d(x, 2.0, axis=1, mode="nearest", truncate=4.0)
    peer = cp.asnumpy(ndimage.gaussian_filter1d(peer, 2.0, axis=0, mode="nearest", truncate=4.0))
    diff = np.abs(got.astype(np.int32) - peer.astype(np.int32))
    assert diff.max() <= 2, diff.max()  # their rounding differs from ours by a step per pass at most
