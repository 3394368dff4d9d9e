"""Probes on wires: min, max, mean and NaN/Inf counts of a buffer, computed inside the graph and read
back without waiting.

``engine.probe(block, port)`` asks for one; the compiler places a probe node (``ProbeNodePlan``) right
after the block that makes the value, so it sees what travels on the wire even when an in-place
consumer rewrites the buffer later (that consumer waits for the probe: a write-after-read hazard).
The node is one reduction kernel (``PROBE_SOURCE``, CUDA C++ built through the same NVRTC path and
cubin cache as the engine's other kernels): each thread block reduces a stretch of the buffer, the last
block to finish combines the partial results and writes the record (and, for an image, a small
thumbnail) into the graph's readback block; the publish node copies it into the host-mapped ring with
the timestamps and append counters. ``Probe.stats`` reads the newest published frame with plain loads:
no driver call, no synchronize.

**Why a probe is a structure edit, not a pre-built disabled node patched Warm.** A probe must depend on
the block that writes its buffer (and in-place writers after it on the probe), so a pre-built node per
probe-able wire would mean one node per output in every graph: twice the nodes to build and
instantiate, and empty-node work on the GPU in every frame of every patch, probed or not. Adding a
probe instead changes the plan, which the build thread builds while the running graph keeps
launching (the frame thread only swaps it in), and a patch without probes carries nothing for them.

Record layout, ``PROBE_WORDS`` uint64 words per probe: ``min``, ``max``, ``sum`` (float64 bits, over the
finite values), ``finite``, ``nan``, ``+inf``, ``-inf``, ``values``; then, for an image, the thumbnail:
``thumb_h`` x ``thumb_w`` bytes, 0 for a non-finite pixel, 1..255 from the frame's min to its max.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "PROBE_BESIDE_BLOCKS",
    "PROBE_KINDS",
    "PROBE_MAX_BLOCKS",
    "PROBE_SCRATCH_WORDS",
    "PROBE_SOURCE",
    "PROBE_THREADS",
    "PROBE_WORDS",
    "THUMB",
    "Probe",
    "ProbeSet",
    "ProbeStats",
    "decode_probe",
    "probe_grid",
    "record_words",
]

PROBE_THREADS = 256
#: The most thread blocks one probe uses: about four per SM of an H100 (132 SMs), for a probe with
#: nothing after it (a value no block reads: the probe ends the frame, so it reads at memory speed).
PROBE_MAX_BLOCKS = 512
#: ... and for a probe that runs beside the blocks reading its value: about one per SM, so it leaves
#: the SMs to the work it runs beside. Measured on the H100 (100 Scales over 1M floats, 10 probes):
#: at 512 blocks each probe beside the chain added 3 µs to the frame, at 128 about 1 µs; the probe at
#: the chain's end took 13 µs at 128 blocks and one load in flight per thread, 9 µs at 512 and four.
PROBE_BESIDE_BLOCKS = 128
#: Values each thread reads at least, before the grid grows another block.
_PER_THREAD = 8
PROBE_WORDS = 8
#: Thumbnails are at most THUMB x THUMB pixels.
THUMB = 16
#: Scratch per probe: the finished-blocks counter, then 7 words of partial results per block.
PROBE_SCRATCH_WORDS = 1 + 7 * PROBE_MAX_BLOCKS

#: NumPy base type -> element kind code of ``PROBE_SOURCE`` (vector types are read lane by lane).
PROBE_KINDS = {"float32": 0, "float64": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "uint8": 6}

PROBE_SOURCE = r"""
#define THREADS 256
#define THUMB 16
struct Acc { double mn, mx, sum; unsigned long long finite, nan, pinf, ninf; };

__device__ __forceinline__ Acc empty_acc() {
    Acc a;
    a.mn = __longlong_as_double(0x7ff0000000000000ULL);  // +inf
    a.mx = -a.mn;
    a.sum = 0.0;
    a.finite = a.nan = a.pinf = a.ninf = 0;
    return a;
}

__device__ __forceinline__ double load(const void* p, unsigned long long i, unsigned int kind) {
    switch (kind) {
    case 0: return (double)((const float*)p)[i];
    case 1: return ((const double*)p)[i];
    case 2: return (double)((const int*)p)[i];
    case 3: return (double)((const unsigned int*)p)[i];
    case 4: return (double)((const long long*)p)[i];
    case 5: return (double)((const unsigned long long*)p)[i];
    default: return (double)((const unsigned char*)p)[i];
    }
}

__device__ __forceinline__ bool finite(double v) {
    return (__double_as_longlong(v) & 0x7ff0000000000000ULL) != 0x7ff0000000000000ULL;
}

__device__ __forceinline__ void add_value(Acc& a, double v) {
    if (finite(v)) {
        a.mn = v < a.mn ? v : a.mn;
        a.mx = v > a.mx ? v : a.mx;
        a.sum += v;
        a.finite++;
    } else if (v != v) {
        a.nan++;
    } else if (v > 0.0) {
        a.pinf++;
    } else {
        a.ninf++;
    }
}

__device__ __forceinline__ void merge(Acc& a, const Acc& b) {
    a.mn = b.mn < a.mn ? b.mn : a.mn;
    a.mx = b.mx > a.mx ? b.mx : a.mx;
    a.sum += b.sum;
    a.finite += b.finite;
    a.nan += b.nan;
    a.pinf += b.pinf;
    a.ninf += b.ninf;
}

__device__ __forceinline__ Acc warp_reduce(Acc a) {
    for (int o = 16; o > 0; o >>= 1) {  // lane 0 ends with the warp's result
        Acc b;
        b.mn = __shfl_down_sync(0xffffffffu, a.mn, o);
        b.mx = __shfl_down_sync(0xffffffffu, a.mx, o);
        b.sum = __shfl_down_sync(0xffffffffu, a.sum, o);
        b.finite = __shfl_down_sync(0xffffffffu, a.finite, o);
        b.nan = __shfl_down_sync(0xffffffffu, a.nan, o);
        b.pinf = __shfl_down_sync(0xffffffffu, a.pinf, o);
        b.ninf = __shfl_down_sync(0xffffffffu, a.ninf, o);
        merge(a, b);
    }
    return a;
}

__device__ Acc block_reduce(Acc a, Acc* warps) {  // the result is thread 0's
    a = warp_reduce(a);
    unsigned int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) warps[w] = a;
    __syncthreads();
    if (w == 0) {
        a = lane < THREADS / 32 ? warps[lane] : empty_acc();
        a = warp_reduce(a);
    }
    __syncthreads();
    return a;
}

extern "C" __global__ void probe(
    const unsigned char* data, unsigned long long n, unsigned int kind, unsigned long long* out,
    unsigned int width, unsigned int height, unsigned int channels, unsigned long long* scratch)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");  // returns at once without a programmatic edge
#endif
    __shared__ Acc warps[THREADS / 32];
    __shared__ bool last;
    __shared__ double lo, hi;
    Acc a = empty_acc();
    unsigned long long step = (unsigned long long)gridDim.x * THREADS;
    unsigned long long i = blockIdx.x * (unsigned long long)THREADS + threadIdx.x;
    for (; i + 3 * step < n; i += 4 * step) {  // four loads in flight per thread: bandwidth, not latency
        double v0 = load(data, i, kind), v1 = load(data, i + step, kind);
        double v2 = load(data, i + 2 * step, kind), v3 = load(data, i + 3 * step, kind);
        add_value(a, v0); add_value(a, v1); add_value(a, v2); add_value(a, v3);
    }
    for (; i < n; i += step)
        add_value(a, load(data, i, kind));
    a = block_reduce(a, warps);
    volatile unsigned long long* parts = scratch + 1;
    if (threadIdx.x == 0) {
        last = gridDim.x == 1;
        if (!last) {  // the last block to finish combines the partial results (no memset, no second kernel)
            volatile unsigned long long* p = parts + 7 * blockIdx.x;
            p[0] = __double_as_longlong(a.mn);
            p[1] = __double_as_longlong(a.mx);
            p[2] = __double_as_longlong(a.sum);
            p[3] = a.finite; p[4] = a.nan; p[5] = a.pinf; p[6] = a.ninf;
            __threadfence();
            last = atomicAdd((unsigned int*)scratch, 1u) == gridDim.x - 1;
        }
    }
    __syncthreads();
    if (!last) return;
    if (gridDim.x > 1) {
        __threadfence();
        a = empty_acc();
        for (unsigned int b = threadIdx.x; b < gridDim.x; b += THREADS) {
            volatile unsigned long long* p = parts + 7 * b;
            Acc o;
            o.mn = __longlong_as_double(p[0]);
            o.mx = __longlong_as_double(p[1]);
            o.sum = __longlong_as_double(p[2]);
            o.finite = p[3]; o.nan = p[4]; o.pinf = p[5]; o.ninf = p[6];
            merge(a, o);
        }
        a = block_reduce(a, warps);
        if (threadIdx.x == 0) *(volatile unsigned int*)scratch = 0;  // ready for the next frame
    }
    if (threadIdx.x == 0) {
        out[0] = __double_as_longlong(a.mn);
        out[1] = __double_as_longlong(a.mx);
        out[2] = __double_as_longlong(a.sum);
        out[3] = a.finite; out[4] = a.nan; out[5] = a.pinf; out[6] = a.ninf;
        out[7] = n;
        lo = a.mn;
        hi = a.mx;
    }
    if (width == 0) return;
    __syncthreads();
    unsigned int tw = width < THUMB ? width : THUMB, th = height < THUMB ? height : THUMB;
    unsigned int lanes = channels < 3 ? channels : 3;  // RGBA: the mean of RGB
    unsigned char* thumb = (unsigned char*)(out + 8);
    for (unsigned int t = threadIdx.x; t < tw * th; t += THREADS) {
        unsigned long long x = ((unsigned long long)(2 * (t % tw) + 1) * width) / (2 * tw);
        unsigned long long y = ((unsigned long long)(2 * (t / tw) + 1) * height) / (2 * th);
        unsigned long long at = (y * width + x) * channels;
        double s = 0.0;
        bool ok = true;
        for (unsigned int c = 0; c < lanes; ++c) {
            double v = load(data, at + c, kind);
            ok = ok && finite(v);
            s += v;
        }
        s /= lanes;
        thumb[t] = !ok ? 0 : (hi > lo ? (unsigned char)(1.5 + 254.0 * (s - lo) / (hi - lo)) : 128);
    }
}
"""


def probe_grid(values: int, *, beside: bool = False) -> int:
    """Thread blocks of a probe over ``values`` scalars: at least ``_PER_THREAD`` values per thread, at
    most ``PROBE_MAX_BLOCKS`` blocks (``PROBE_BESIDE_BLOCKS`` when ``beside``: blocks read the value
    while the probe runs)."""
    most = PROBE_BESIDE_BLOCKS if beside else PROBE_MAX_BLOCKS
    return max(1, min(most, -(-values // (PROBE_THREADS * _PER_THREAD))))


def record_words(thumb_w: int, thumb_h: int) -> int:
    """uint64 words of one probe's record with a ``thumb_w`` x ``thumb_h`` thumbnail (0 x 0: none)."""
    return PROBE_WORDS + -(-(thumb_w * thumb_h) // 8)


@dataclass(frozen=True)
class ProbeStats:
    """What a probe measured in one completed frame.

    Attributes:
        frame: The engine frame (``engine.counters.frames`` when it was launched) the values are from.
        age: How many frames old they are (1: the frame of the last launch).
        values: Scalars examined (elements x lanes of a vector type).
        minimum / maximum / mean: Over the finite values (None when there is none).
        nan: NaN values.
        inf: Infinite values (``+inf`` and ``-inf``).
        thumbnail: For an image, ``(h, w)`` uint8: 0 where a pixel is not finite, 1..255 from ``minimum``
            to ``maximum`` (None otherwise).
    """

    frame: int
    age: int
    values: int
    minimum: float | None
    maximum: float | None
    mean: float | None
    nan: int
    inf: int
    thumbnail: np.ndarray | None = None

    @property
    def finite(self) -> int:
        """Finite values."""
        return self.values - self.nan - self.inf

    @property
    def bad(self) -> bool:
        """Whether any value is NaN or infinite."""
        return bool(self.nan or self.inf)

    def __str__(self) -> str:
        if self.minimum is None:
            span = "no finite value"
        else:
            span = f"min {self.minimum:.6g}  max {self.maximum:.6g}  mean {self.mean:.6g}"
        return f"{span}  NaN {self.nan:,}  Inf {self.inf:,}  (frame {self.frame})"


_RECORD = struct.Struct("<3d5Q")  # min, max, sum (float64); finite, nan, +inf, -inf, values


def decode_probe(words: np.ndarray, *, frame: int, age: int, thumb: tuple[int, int] = (0, 0)) -> ProbeStats:
    """A probe's record (``words``: its uint64 words in the readback ring) as ``ProbeStats``.

    Args:
        words: At least ``record_words(*thumb)`` words.
        frame / age: The frame the ring holds, and its age.
        thumb: ``(thumb_w, thumb_h)`` of the probe's node.
    """
    w = np.asarray(words, dtype=np.uint64)
    # One unpack of the record's bytes: the editor reads every probe each frame (NumPy scalar by
    # scalar took about 10 µs a probe, measured on the H100 host).
    mn, mx, total, finite, nan, pinf, ninf, values = _RECORD.unpack(w[:PROBE_WORDS].tobytes())
    image = None
    tw, th = thumb
    if tw and th:
        image = w[PROBE_WORDS : record_words(tw, th)].view(np.uint8)[: tw * th].reshape(th, tw).copy()
    if not finite:
        return ProbeStats(frame, age, values, None, None, None, nan, pinf + ninf, image)
    return ProbeStats(frame, age, values, mn, mx, total / finite, nan, pinf + ninf, image)


class Probe:
    """A probed wire: the output ``port`` of ``block``. Made by ``engine.probe``; ``close()`` removes it.

    ``stats`` is the newest completed frame's ``ProbeStats`` (None until the graph that has the probe
    has run a frame to the end, or while the block is not running). Reading it makes no driver call.
    """

    def __init__(self, owner: ProbeSet, key: tuple[int, str], block: Any, port: str) -> None:
        self._owner = owner
        self.key = key
        self.block = block
        self.port = port
        self._closed = False

    @property
    def stats(self) -> ProbeStats | None:
        """The newest published statistics (no driver call), or None."""
        return None if self._closed else self._owner.stats(self.key)

    @property
    def running(self) -> bool:
        """Whether the running graph has this probe's node."""
        return not self._closed and self._owner.running(self.key)

    def close(self) -> None:
        """Stop probing (a structure edit, built on the build thread); idempotent."""
        if not self._closed:
            self._closed = True
            self._owner.remove(self)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<Probe {getattr(self.block, 'name', self.block)}.{self.port} closed={self._closed}>"


class ProbeSet:
    """The probes of one engine: one ``Probe`` per probed output, and reading them from the running graph.

    Args:
        context: The engine's ``Context`` (the probed outputs are part of its snapshot).
        graph: Returns the running ``CompiledGraph`` (or None).
    """

    def __init__(self, context: Any, graph: Callable[[], Any]) -> None:
        self._context = context
        self._graph = graph
        self._probes: dict[tuple[int, str], Probe] = {}

    def add(self, block: Any, port: str, shape: tuple[int, int] | None = None) -> Probe:
        """Probe output ``port`` of ``block`` (an input: the output linked into it); the same output
        probed twice gives the same ``Probe``. See ``Context.add_probe``.

        Raises:
            LinkError: unknown port, an unlinked input, or another engine's block.
        """
        if shape is not None:
            shape = (int(shape[0]), int(shape[1]))
        key = self._context.add_probe(block, port, shape)
        p = self._probes.get(key)
        if p is None or p.is_closed:
            src = self._context.registry.get(key[0])
            p = self._probes[key] = Probe(self, key, src if src is not None else block, key[1])
        return p

    def remove(self, probe: Probe) -> None:
        """Stop probing ``probe``'s output."""
        if self._probes.get(probe.key) is probe:
            del self._probes[probe.key]
            self._context.remove_probe(probe.key)

    def _live(self) -> list[Probe]:
        # A removed block took its probes from the patch: their handles are left, reading None.
        probed = self._context.probes
        return [p for k, p in self._probes.items() if k in probed]

    def __iter__(self) -> Any:
        return iter(self._live())

    def __len__(self) -> int:
        return len(self._live())

    def running(self, key: tuple[int, str]) -> bool:
        g = self._graph()
        return g is not None and key in g.plan.probes

    def stats(self, key: tuple[int, str]) -> ProbeStats | None:
        """The newest published statistics of ``key``'s probe in the running graph (plain loads)."""
        g = self._graph()
        if g is None:
            return None
        return g.probe_stats(key)
