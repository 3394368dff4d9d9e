"""The examples' patch files (08, 09, 10) on the GPU, against the NumPy references of their ``.py``
twins: each ``.toml`` loaded through the host adapter by the standalone host, as ``cudapatch run``
loads it (``StandaloneHost``, without the GL preview), its preview image kept in a buffer of its own
as the preview keeps it, frames run, outputs read back.

The solver states match NumPy bit for bit (the kernels round every operation alone). The preview
images may differ from NumPy by one step per channel: they truncate floats to bytes, and the compiler
may contract a product and a sum into one FMA there."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from cudapatch.host_plugin.hosts.standalone import StandaloneHost

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name.replace(".py", ""), EXAMPLES / name)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def _start(host: StandaloneHost, *kept: tuple[str, str]) -> None:
    """Keep ``(operator, port)`` outputs (the preview keeps its image so; read here after frames), then
    build: every ``update()`` after this launches one frame of the same graph."""
    for op, port in kept:
        host.engine.keep(host.adapter.block(op), port)
    host.engine.wait_ready()


def _run(host: StandaloneHost, frames: int) -> None:
    eng = host.engine
    rebuilds, first = eng.counters.rebuilds, eng.counters.frames
    for _ in range(frames):
        eng.update()
    eng.synchronize()
    assert eng.counters.frames - first == frames and eng.counters.rebuilds == rebuilds  # frames of one graph
    assert host.messages("error") == []


def _bytes_close(got: np.ndarray, want: np.ndarray) -> None:
    """Packed RGBA8 pixels (uint32) at most one step apart in every channel."""
    assert got.shape == want.shape
    diff = np.abs(got.view(np.uint8).astype(np.int32) - want.view(np.uint8).astype(np.int32))
    assert diff.max() <= 1, f"{np.count_nonzero(diff > 1)} channels off by more than one step"


def _rgba(r: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (
        r.astype(np.uint32) | (g.astype(np.uint32) << 8) | (b.astype(np.uint32) << 16) | np.uint32(255 << 24)
    ).astype(np.uint32)


def test_the_jacobi_patch_file_solves_as_numpy() -> None:
    mod = _example("08_jacobi.py")
    with StandaloneHost(EXAMPLES / "08_jacobi.toml") as host:
        _start(host, ("Colorize", "rgba"), ("SweepB", "u"))
        block = host.adapter.block
        solve, sweep, decide, colorize = block("Solve"), block("SweepA"), block("Decide"), block("Colorize")
        _run(host, 3)
        eng = host.engine
        u, rgba, its = eng.read(block("SweepB"), "u"), eng.read(colorize, "rgba"), eng.iterations(solve)
        nx, h2, unroll = int(sweep.get("nx")), float(sweep.get("h2")), int(solve.get("Unroll"))
        tol, scale, max_its = (
            float(np.float32(decide.get("tol"))),
            np.float32(colorize.get("scale")),
            int(solve.get("Max")),
        )
    f = np.ones(nx * nx, np.float32)
    _, exact = mod.jacobi_numpy(nx, f, h2, tol, max_its)
    assert exact < max_its  # converged: the While stopped on its condition, not at Max
    assert exact <= its <= exact + unroll - 1  # up to Unroll - 1 past convergence: the condition is read once a pass
    ref, _ = mod.jacobi_numpy(nx, f, h2, -1.0, its)  # a negative tolerance never stops: exactly its iterations
    np.testing.assert_array_equal(u, ref)
    v = np.clip(-ref * scale, np.float32(0), np.float32(1)).astype(np.float32)  # colorize.cu, operation by operation
    r = np.float32(255) * v
    g = r * v * np.float32(0.8)
    b = np.float32(255) * (np.float32(1) - v) * np.float32(0.5)
    _bytes_close(rgba, _rgba(r.astype(np.uint32), g.astype(np.uint32), b.astype(np.uint32)))


def _life_seed(n: int, seed: int) -> np.ndarray:
    """The patch's ``seed`` kernel: a hash of each cell's index, alive where it is 0, 1 or 2 mod 10."""
    x = (np.arange(n, dtype=np.uint32) ^ np.uint32(seed)) * np.uint32(2654435761)
    x ^= x >> np.uint32(15)
    x *= np.uint32(2246822519)
    x ^= x >> np.uint32(13)
    return ((x % np.uint32(10)) < 3).astype(np.uint8)


def test_the_game_of_life_patch_file_runs_the_generations_numpy_does() -> None:
    mod = _example("09_game_of_life.py")
    frames = 6
    with StandaloneHost(EXAMPLES / "09_game_of_life.toml") as host:
        _start(host, ("paint", "rgba"), ("life", "next"), ("seed", "cells"))
        block = host.adapter.block
        life, seed = block("life"), block("seed")
        h, w, n, start = int(life.get("height")), int(life.get("width")), int(seed.get("Count")), int(seed.get("Seed"))
        _run(host, frames)
        eng = host.engine
        cells, nxt, rgba = eng.read(seed, "cells"), eng.read(life, "next"), eng.read(block("paint"), "rgba")
    first = _life_seed(n, start)
    np.testing.assert_array_equal(cells, first)
    ref = mod.generations(first.reshape(h, w), frames).reshape(-1)  # generation 1 in frame 1 (Init, then a step)
    np.testing.assert_array_equal(nxt, ref)
    np.testing.assert_array_equal(rgba, np.where(ref == 1, np.uint32(0xFFD0F0FF), np.uint32(0xFF301808)))


def test_the_reaction_diffusion_patch_file_steps_as_numpy() -> None:
    mod = _example("10_reaction_diffusion.py")
    frames = 2
    with StandaloneHost(EXAMPLES / "10_reaction_diffusion.toml") as host:
        _start(host, ("paint", "rgba"), ("seed", "s"))
        block = host.adapter.block
        step, loop, seed = block("step"), block("Steps"), block("seed")
        h, w, count = int(step.get("height")), int(step.get("width")), int(loop.get("Count"))
        params = {k: float(step.get(k)) for k in mod.PARAMS}
        _run(host, frames)
        eng = host.engine
        start = eng.read(seed, "s").reshape(h * w, 2)
        field, rgba, its = (
            eng.read(step, "next").reshape(h * w, 2),
            eng.read(block("paint"), "rgba"),
            eng.iterations(loop),
        )
    assert params == pytest.approx(mod.PARAMS)  # the .py's reference runs with the .toml's parameters
    # the seed's hash, as a float sum the compiler may contract into one FMA: at most one step apart
    i = np.arange(h * w, dtype=np.uint32)
    x = i * np.uint32(2654435761)
    noise = ((x ^ (x >> np.uint32(15))) & np.uint32(1023)).astype(np.float32) * (np.float32(0.01) / np.float32(1024))
    y, xs = (i // w).astype(np.int64), (i % w).astype(np.int64)
    inside = (np.abs(xs - w // 2) < w // 10) & (np.abs(y - h // 2) < h // 10)
    want = np.stack([np.where(inside, 0.5, 1.0), np.where(inside, 0.25, 0.0)], axis=-1).astype(np.float32)
    np.testing.assert_allclose(start, want + noise[:, None], rtol=3e-7, atol=0)
    assert its == count
    ref = mod.gray_scott(start, h, w, frames * count)  # from the GPU's seed: frames x Count steps
    np.testing.assert_array_equal(field, ref)
    t = np.clip(ref[:, 1] * np.float32(3), np.float32(0), np.float32(1)).astype(np.float32)  # paint, as written
    r = (np.float32(255) * t).astype(np.uint32)
    g = (np.float32(200) * t + np.float32(24) * (np.float32(1) - t)).astype(np.uint32)
    b = (np.float32(160) * t + np.float32(64) * (np.float32(1) - t)).astype(np.uint32)
    _bytes_close(rgba, _rgba(r, g, b))
