"""A GPU particle system: Emitter → Forces → Integrate → ToPoints (the default demo patch).

The particles live in one ``float4`` state buffer (header + two halves, see ``kernels/particles.cu``)
that flows through the chain with ``through`` ports and persists across frames. Each frame the
Emitter spawns ``Rate * Dt`` particles, Forces accelerates them (gravity, curl noise, an attractor),
Integrate moves and ages them and compacts the survivors into the other half through an atomic
append counter, and ToPoints writes positions and colors for drawing. Every scalar is a Hot
parameter; only ``Capacity`` and ``MaxPerFrame`` rebuild the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from ...kernels.cuda_source import CudaSource
from ...kernels.types import DType
from ..block import Block
from ..builder import BlockBuilder
from ..description import from_param, like

__all__ = [
    "Emitter",
    "Forces",
    "Integrate",
    "ToPoints",
    "PARTICLE_BLOCKS",
    "STATE_HEADER",
    "ParticleState",
    "particle_capacity",
    "read_particles",
]

KERNEL_FILE = Path(__file__).with_name("kernels") / "particles.cu"
STATE_HEADER = 2  # float4 elements in front of the two halves


@cache
def _kernel(entry: str) -> CudaSource:
    return CudaSource(path=KERNEL_FILE, entry=entry)


def particle_capacity(state_elements: int) -> int:
    """Capacity of a particle state buffer of ``state_elements`` float4 elements."""
    return max(0, (state_elements - STATE_HEADER) // 4)


STATE_MAGIC = 0x43505354  # "CPST", written by particles_begin


@dataclass(frozen=True)
class ParticleState:
    """The live particles of a state buffer after a frame (host copies).

    Attributes:
        capacity: Particles the buffer holds at most.
        frame: Frames simulated since the buffer was (re)initialised.
        positions: ``(alive, 4)``: x, y, z, lifetime.
        velocities: ``(alive, 4)``: vx, vy, vz, age.
    """

    capacity: int
    frame: int
    positions: np.ndarray
    velocities: np.ndarray

    @property
    def alive(self) -> int:
        return len(self.positions)


def read_particles(state: np.ndarray) -> ParticleState:
    """Decode a particle state buffer (``engine.read(emitter, "Particles")``): the particles that
    survived the last frame, as Integrate compacted them.

    Raises:
        ValueError: not a particle state buffer (wrong size or header).
    """
    raw = np.ascontiguousarray(state).view(np.float32).reshape(-1, 4)
    capacity = particle_capacity(len(raw))
    header = raw[:STATE_HEADER].view(np.uint32)
    if len(raw) != 4 * capacity + STATE_HEADER or header[0, 0] != STATE_MAGIC or header[0, 1] != capacity:
        raise ValueError("not a particle state buffer (no Emitter has run on it yet, or the size is wrong)")
    frame = int(header[0, 2])
    done = (frame & 1) ^ 1  # the half Integrate appended this frame's survivors to
    alive = min(int(header[1, done]), capacity)
    base = STATE_HEADER + done * 2 * capacity
    return ParticleState(
        capacity, frame, raw[base : base + alive].copy(), raw[base + capacity : base + capacity + alive].copy()
    )


# The state buffer's capacity, for blocks downstream of the Emitter: (4 * capacity + 2) // 4.
_CAPACITY = like("Particles", divide=4)


class Emitter(Block):
    """Spawns ``Rate`` particles per second at ``Origin`` into the particle state (capacity
    ``Capacity``), moving along +y inside a cone of opening ``Spread`` (0..1) at about ``Speed``,
    living about ``Lifetime`` seconds. ``Dt`` is the frame time step."""

    type_name = "Emitter"

    def describe(self, b: BlockBuilder) -> None:
        begin = b.add_kernel(_kernel("particles_begin"))
        emit = b.add_kernel(_kernel("particles_emit"))
        b.scalar("Capacity", dtype=DType.UINT32, default=1 << 20, range=(1, 1 << 26), description="maximum particles")
        b.scalar("MaxPerFrame", emit.in_(2), default=1 << 16, range=(1, 1 << 24), description="spawn limit per frame")
        b.output("Particles", begin.out(0), emit.out(0), size=from_param("Capacity", scale=4, extra=STATE_HEADER))
        begin.set_count(1, from_param("Capacity"))
        emit.set_count(1, from_param("Capacity"))
        b.scalar("Rate", begin.in_(2), default=200_000.0, range=(0.0, None), description="particles per second")
        b.scalar("Dt", begin.in_(3), default=1.0 / 60.0, range=(0.0, 1.0), description="time step (s)")
        b.scalar("Origin", emit.in_(3), default=(0.0, -0.5, 0.0))
        b.scalar("Speed", emit.in_(4), default=1.2, range=(0.0, None))
        b.scalar("Spread", emit.in_(5), default=0.35, range=(0.0, 1.0))
        b.scalar("Lifetime", emit.in_(6), default=4.0, range=(0.0, None), description="seconds")
        emit.auto_grid(from_param("MaxPerFrame"))


class Forces(Block):
    """Accelerates the particles in place: ``Gravity``, curl noise (``Curl`` strength at spatial
    frequency ``CurlScale``), an ``Attractor`` point of strength ``Attraction``, and ``Drag``."""

    type_name = "Forces"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(_kernel("particles_forces"))
        b.input("Particles", k.in_(0))
        b.through("Particles")
        k.set_count(1, _CAPACITY)
        b.scalar("Gravity", k.in_(2), default=(0.0, -0.6, 0.0))
        b.scalar("Curl", k.in_(3), default=1.5)
        b.scalar("CurlScale", k.in_(4), default=2.0)
        b.scalar("Attractor", k.in_(5), default=(0.0, 0.6, 0.0))
        b.scalar("Attraction", k.in_(6), default=0.15)
        b.scalar("Drag", k.in_(7), default=0.4, range=(0.0, None))
        b.scalar("Dt", k.in_(8), default=1.0 / 60.0, range=(0.0, 1.0))
        k.auto_grid(_CAPACITY)


class Integrate(Block):
    """Moves and ages the particles; those past their lifetime are compacted out (the survivors are
    appended to the state's other half through an atomic counter)."""

    type_name = "Integrate"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(_kernel("particles_integrate"))
        b.input("Particles", k.in_(0))
        b.through("Particles")
        k.set_count(1, _CAPACITY)
        b.scalar("Dt", k.in_(2), default=1.0 / 60.0, range=(0.0, 1.0))
        k.auto_grid(_CAPACITY)


class ToPoints(Block):
    """Writes ``Points``: ``capacity`` positions ``(x, y, z, size)`` then ``capacity`` colors
    ``(r, g, b, a)``, fading from ``Young`` to ``Old`` over each particle's life. Dead slots get size 0.
    The preview draws this buffer as a GL vertex buffer."""

    type_name = "ToPoints"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(_kernel("particles_to_points"))
        b.input("Particles", k.in_(0))
        b.output("Points", k.out(1), size=like("Particles", divide=4, scale=2))
        k.set_count(2, _CAPACITY)
        b.scalar("Size", k.in_(3), default=2.0, range=(0.0, 64.0))
        b.scalar("Young", k.in_(4), default=(1.0, 0.75, 0.35))
        b.scalar("Old", k.in_(5), default=(0.25, 0.35, 1.0))
        k.auto_grid(_CAPACITY)


PARTICLE_BLOCKS = (Emitter, Forces, Integrate, ToPoints)
