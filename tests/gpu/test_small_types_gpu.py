"""FrameDelay, Upload and Download of the 8- and 16-bit element types on a real GPU: their generated
kernels compile (``half`` as ``__half`` with its header, ``ushort`` as ``unsigned short``) and move
every bit. (The spelling and the port types are unit-tested: tests/unit/test_generated_element_types.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Download, DownloadRing, Engine, FrameDelay, Upload, UploadRing

pytestmark = pytest.mark.gpu

TYPES = {"half": np.float16, "ushort": np.uint16, "short": np.int16, "char": np.int8}


def _values(rng: np.random.Generator, type_name: str, n: int) -> np.ndarray:
    dt = TYPES[type_name]
    if dt is np.float16:
        return rng.standard_normal(n).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, n, endpoint=True).astype(dt)


@pytest.mark.parametrize("type_name", TYPES)
def test_delay_init_and_download_move_every_bit(engine: Engine, rng: np.random.Generator, type_name: str) -> None:
    n = 1000
    x0 = _values(rng, type_name, n)
    delay = engine.add(FrameDelay(name="delay", Type=type_name))
    tap = engine.add(Download(name="tap", Type=type_name))
    engine.bind(delay, "Init", x0)
    engine.connect(delay, "Out", tap, "In")
    with DownloadRing(engine, tap, n) as ring:
        engine.update()
        engine.synchronize()
        values, frame = ring.read()
    assert frame == 1 and values.dtype == x0.dtype
    np.testing.assert_array_equal(values.view(np.uint8), x0.view(np.uint8))
    assert not [d for d in engine.diagnostics() if d.severity == "error"]


@pytest.mark.parametrize(("type_name", "fill"), [("half", 1.5), ("ushort", 65535), ("char", -7)])
def test_delay_fill_of_a_small_type(engine: Engine, type_name: str, fill: float) -> None:
    n = 256
    delay = engine.add(FrameDelay(name="delay", Type=type_name, Count=n, Fill=fill))
    tap = engine.add(Download(name="tap", Type=type_name))
    engine.connect(delay, "Out", tap, "In")
    with DownloadRing(engine, tap, n) as ring:
        engine.update()
        engine.synchronize()
        values, _ = ring.read()
    np.testing.assert_array_equal(values, np.full(n, fill, TYPES[type_name]))


@pytest.mark.parametrize("type_name", TYPES)
def test_upload_of_a_small_type_round_trips(engine: Engine, rng: np.random.Generator, type_name: str) -> None:
    n = 777
    up = engine.add(Upload(name="up", Type=type_name, Count=n))
    tap = engine.add(Download(name="tap", Type=type_name))
    engine.connect(up, "Out", tap, "In")
    with UploadRing(engine, up) as feed, DownloadRing(engine, tap, n) as ring:
        engine.update()
        engine.synchronize()
        x = _values(rng, type_name, n)
        assert feed.write(x)
        engine.update()
        engine.synchronize()
        values, _ = ring.read()
    np.testing.assert_array_equal(values.view(np.uint8), x.view(np.uint8))
