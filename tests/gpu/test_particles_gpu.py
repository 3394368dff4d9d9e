"""The particle system on the GPU: spawning, forces, compaction of dead particles, steady state."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch.blocks.library import Emitter, Forces, Integrate, ToPoints, particle_capacity

pytestmark = pytest.mark.gpu

MAGIC = 0x43505354


def _state(engine, emitter):
    raw = np.ascontiguousarray(engine.read(emitter, "Particles")).view(np.float32).reshape(-1, 4)
    header = raw[:2].view(np.uint32)
    cap = particle_capacity(len(raw))
    frame = int(header[0, 2])
    done = (frame & 1) ^ 1  # the half Integrate appended this frame's survivors to
    n = int(header[1, done])
    base = 2 + done * 2 * cap
    return header, cap, n, raw[base : base + n], raw[base + cap : base + cap + n]


def _demo(engine, capacity=100_000, rate=60_000.0, lifetime=1.0):
    e, f, i, t = (engine.add(cls()) for cls in (Emitter, Forces, Integrate, ToPoints))
    e.set("Capacity", capacity)
    e.set("Rate", rate)
    e.set("Lifetime", lifetime)
    engine.connect(e, "Particles", f, "Particles")
    engine.connect(f, "Particles", i, "Particles")
    engine.connect(i, "Particles", t, "Particles")
    return e, f, i, t


def test_demo_reaches_a_sane_steady_state(engine):
    e, f, i, t = _demo(engine)
    counts = []
    for frame in range(300):
        engine.update()
        if frame >= 240 and frame % 10 == 0:
            counts.append(_state(engine, e)[2])
    header, cap, n, pos_life, vel_age = _state(engine, e)
    assert header[0, 0] == MAGIC and header[0, 1] == cap == 100_000
    assert header[0, 2] == 300  # one frame per update
    # spawn 1000 per frame, lifetimes uniform in [0.5, 1] s -> about 1000 * 45 alive
    assert 35_000 < n < 55_000, n
    assert max(counts) - min(counts) < 0.05 * n, counts  # stable at steady state
    assert np.isfinite(pos_life).all() and np.isfinite(vel_age).all()
    assert (vel_age[:, 3] < pos_life[:, 3]).all()  # every survivor is younger than its lifetime
    assert (np.abs(pos_life[:, :3]) < 50).all()
    points = engine.read(t, "Points").view(np.float32).reshape(-1, 4)
    assert points.shape == (2 * cap, 4)
    assert np.allclose(points[:n, 3], 2.0) and not points[n:cap, 3].any()  # dead slots have size 0
    assert np.array_equal(points[:n, :3], pos_life[:, :3] + vel_age[:, :3] * 0)  # positions as integrated
    assert ((points[cap : cap + n, 3] >= 0) & (points[cap : cap + n, 3] <= 1)).all()


def test_rate_zero_compacts_everything_out_and_rate_is_hot(engine):
    e, f, i, t = _demo(engine, capacity=20_000, rate=30_000.0, lifetime=0.5)
    for _ in range(60):
        engine.update()
    assert _state(engine, e)[2] > 1000
    rebuilds = engine.counters.rebuilds
    e.set("Rate", 0.0)
    for _ in range(40):  # > 0.5 s of frames: every particle dies
        engine.update()
    assert _state(engine, e)[2] == 0
    assert engine.counters.rebuilds == rebuilds  # a Hot change, no rebuild


def test_capacity_limits_the_particles(engine):
    e, f, i, t = _demo(engine, capacity=5_000, rate=600_000.0, lifetime=2.0)
    for _ in range(30):
        engine.update()
    header, cap, n, pos_life, vel_age = _state(engine, e)
    assert cap == 5000 and 4000 < n <= 5000


def test_forces_follow_gravity_without_other_forces(engine):
    e, f, i, t = _demo(engine, capacity=4096, rate=600.0, lifetime=10.0)
    e.set("Speed", 0.0)
    for name, v in (("Curl", 0.0), ("Attraction", 0.0), ("Drag", 0.0)):
        f.set(name, v)
    f.set("Gravity", (0.0, -1.0, 0.0))
    for _ in range(31):
        engine.update()
    _, _, n, pos_life, vel_age = _state(engine, e)
    assert n > 100
    # the oldest particle has had about 30 frames of gravity: v = -g * frames * dt (float64 reference)
    oldest = np.argmax(vel_age[:, 3])
    frames = round(float(vel_age[oldest, 3]) * 60)
    assert vel_age[oldest, 1] == pytest.approx(-frames / 60.0, rel=1e-4)
    assert np.allclose(vel_age[:, [0, 2]], 0.0)
