"""Profiling levels and the statistics the engine reports (DESIGN.md §6).

Levels add timestamp nodes to the graph (placed by the compiler; inside regions' bodies, timer kernels),
so changing the level is a structure change. ``None`` adds none at all. Results come back through the engine's ring of
three in-flight frames and are read only when someone asks (``Engine.stats()``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from ..errors import CudapatchError

__all__ = ["ProfilingLevel", "BlockStats", "EngineStats", "KernelStats", "AppendStats"]


class ProfilingLevel(Enum):
    """How much the engine measures. Each level includes what the levels before it measure."""

    NONE = "None"  # no event nodes at all
    SUMMARY = "Summary"  # one event pair around the whole graph
    PER_BLOCK = "PerBlock"  # + a pair around each block's kernels
    PER_KERNEL = "PerKernel"  # + a pair around each kernel (captured library nodes count as one)
    DEEP_ASYNC = "DeepAsync"  # + append fill and kernel occupancy, read asynchronously
    DEEP_SYNC = "DeepSync"  # the same, but each update() waits and reports the current frame exactly

    @classmethod
    def parse(cls, value: str | ProfilingLevel) -> ProfilingLevel:
        """A level from its name (``"PerBlock"``, case-insensitive) or a level.

        Raises:
            CudapatchError: unknown name (lists the valid ones).
        """
        if isinstance(value, ProfilingLevel):
            return value
        key = str(value).replace("_", "").replace("-", "").lower()
        for level in cls:
            if level.value.lower() == key or level.name.replace("_", "").lower() == key:
                return level
        raise CudapatchError(f"unknown profiling level {value!r} (levels: {', '.join(level.value for level in cls)})")

    @property
    def timed(self) -> bool:
        """True if the graph carries timing events."""
        return self is not ProfilingLevel.NONE

    def at_least(self, other: ProfilingLevel) -> bool:
        order = list(ProfilingLevel)
        return order.index(self) >= order.index(other)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class KernelStats:
    """One kernel of a block: its GPU time (PerKernel and above) and occupancy (Deep levels)."""

    entry_point: str
    gpu_ms: float | None
    occupancy: float | None


@dataclass(frozen=True)
class AppendStats:
    """An append output's fill in the reported frame."""

    count: int
    capacity: int
    overflowed: bool

    @property
    def fill(self) -> float:
        return self.count / self.capacity if self.capacity else 0.0


@dataclass(frozen=True)
class BlockStats:
    """What one block did in the reported frame.

    ``gpu_ms`` is its GPU time in the frame (PerBlock and above). A block inside a region's body (or a
    region nested in one) is timed on the device every time it runs (``compiler/body_timers.py``):
    ``gpu_ms`` is then the sum over the frame, ``runs`` how often it ran (a loop's iterations, those of
    the loops around it multiplied in; 0 or 1 in an ``If``), ``mean_ms`` the time of one run, ``min_ms``
    and ``max_ms`` the shortest and longest. Outside bodies ``runs`` and the rest are None.
    """

    block_id: int
    name: str
    state: str
    message: str
    gpu_ms: float | None
    kernels: tuple[KernelStats, ...] = ()
    append: dict[str, AppendStats] = field(default_factory=dict)
    fused: str = ""  # the fused group the block runs in ("a -> b -> c"), empty when it runs alone
    runs: int | None = None
    min_ms: float | None = None
    max_ms: float | None = None

    @property
    def mean_ms(self) -> float | None:
        """GPU time of one run (one iteration) of a block inside a body, None elsewhere or if it did not run."""
        return self.gpu_ms / self.runs if self.runs and self.gpu_ms is not None else None


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for overlays and hosts. ``frame`` is the frame the GPU numbers come from, ``age``
    how many frames ago that was (None: no frame has completed yet, so there are no GPU numbers)."""

    level: ProfilingLevel
    frame: int | None
    age: int | None
    gpu_ms: float | None
    blocks: tuple[BlockStats, ...]
    kernels: int
    pool_in_use_bytes: int
    pool_total_bytes: int
    diagnostics: tuple = ()
    #: Device bytes of the running graph's buffers, and of its outputs were each in a buffer of its own
    #: (their ratio is what buffer reuse saves).
    buffer_bytes: int = 0
    value_bytes: int = 0
    #: GPU time of every timed block by block id (PerBlock and up; a block in a region's body: its sum
    #: over the frame). ``blocks`` has a row per registered block only; this also holds the blocks inside
    #: composites (whose own row is the span of them all), for hosts that show a composite's inside.
    block_ms: Mapping[int, float] = field(default_factory=dict)
