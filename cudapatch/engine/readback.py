"""A ring of 3 in-flight frames for reading small device values without stalling: profiling
timestamps (uint64), append counters (uint32) and probe records (uint64 words, ``engine/probes.py``),
which the graph keeps in one device block.

The graph itself publishes that block into mapped pinned host memory as its last node, so reading
it costs the frame no driver call (see ``ReadbackRing``).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .._lifecycle import ContextRef, HandleOwner, Releases
from ..kernels._driver import check, driver

__all__ = ["PUBLISH_SOURCE", "PUBLISH_THREADS", "STAMP_SOURCE", "ReadbackRing", "RING_FRAMES", "newest_published"]

RING_FRAMES = 3


#: The kernel that ends every graph with readback: it copies the readback block into the next slot
#: of a 3-slot ring in mapped pinned host memory and counts the frame on the device. Each slot is
#: ``[unused, frame, values...]``; the frame word is written last, after one system-scope fence, and
#: the publish of frame ``f`` clears the frame word of the slot frame ``f + 1`` will write, a whole
#: frame before it is rewritten. The host reads the ring with plain loads: no driver call per frame.
#: (Measured on the H100 with 100 chained kernels: the earlier seqlock, with a fence before the data
#: as well, cost a frame 0.95 %; this one 0.6 %.)
PUBLISH_SOURCE = r"""
extern "C" __global__ void publish(unsigned long long* src, unsigned int words,
                                   unsigned long long* ring, unsigned int slot_words,
                                   unsigned long long* frames, unsigned int end_stamp)
{
    __shared__ unsigned long long frame;
#if __CUDA_ARCH__ >= 900
    // Launched early behind the graph's last kernels (programmatic edges): wait until they are done
    // and their writes are visible. Without such an edge this returns at once.
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (threadIdx.x == 0) {
        if (end_stamp) {  // the graph's end time (profiling), in its timestamp slot
            unsigned long long t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            src[end_stamp] = t;
        }
        frame = *frames + 1;
    }
    __syncthreads();
    volatile unsigned long long* slot = ring + (frame % 3) * slot_words;  // the host reads it: no caching
    for (unsigned int i = threadIdx.x; i < words; i += blockDim.x) slot[2 + i] = src[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");  // every value reaches the host before the frame word
        slot[1] = frame;
        *frames = frame;
        ring[((frame + 1) % 3) * slot_words + 1] = 0;  // the slot the next frame writes: no longer complete
    }
}
"""
PUBLISH_THREADS = 128

#: A profiling timestamp: the GPU's nanosecond timer into one slot. A stamp beside a kernel hangs on
#: a programmatic edge (see ``realize``): it is launched while that kernel runs and waits for its end
#: here, so the timer is read right after the kernel finishes. (Measured on the H100, 100 chained
#: kernels: stamps on plain edges cost the frame 5.4 % and read each kernel as 3.49 µs; on
#: programmatic edges 0.8 % and 3.36 µs, the chain's own time per kernel.)
STAMP_SOURCE = r"""
extern "C" __global__ void stamp(unsigned long long* slots, unsigned int index)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    slots[index] = t;
}
"""


def newest_published(frames: list[int], latest: int) -> int | None:
    """The ring slot holding the newest complete frame newer than ``latest``, else None.
    ``frames[slot]`` is the slot's frame word: 0 while the slot is (about to be) rewritten or was
    never written."""
    best, best_frame = None, latest
    for slot, f in enumerate(frames):
        if f > best_frame:
            best, best_frame = slot, f
    return best


class ReadbackRing(HandleOwner):
    """Asynchronous readback, 3 frames deep, of ``stamps`` uint64 timestamps followed by ``count``
    uint32 counters (padded to a whole uint64 word) and ``probe_words`` uint64 words of probe records,
    that the graph keeps in one device block at ``device_ptr``; ``frames_ptr`` is 8 device bytes where
    the graph counts the frames it published.

    The graph's last node (the ``publish`` kernel, see ``publish_args``) writes the block into the
    ring in mapped pinned host memory; ``poll`` reads the newest complete slot with plain loads and
    checks the slot's frame word again after copying, so a slot being rewritten is never taken. Per frame
    the host makes no driver call at all (an event query and a copy per frame measured about 3x
    the host time of a bare launch).

    A ``HandleOwner`` (see ``cudapatch._lifecycle``): its ``CompiledGraph`` closes it, or abandons
    it with the context; a ring nobody closed is freed by its finalizer, with a ``ResourceWarning``.

    Raises:
        CudaError: the pinned or device allocation failed.
    """

    def __init__(
        self,
        device_ptr: int,
        count: int,
        *,
        stamps: int = 0,
        frames_ptr: int,
        stream: Any = None,
        probe_words: int = 0,
    ) -> None:
        d = driver()
        self.device_ptr = device_ptr
        self.count = count
        self.stamps = stamps
        self.nbytes = 8 * stamps + 4 * count  # timestamps and counters
        self.probe_words = probe_words
        self._probes_at = stamps + (count + 1) // 2  # the probe records' first word
        self.words = self._probes_at + probe_words
        self.slot_words = 2 + max(self.words, 1)
        self.latest = np.zeros(count, dtype=np.uint32)
        self.latest_stamps = np.zeros(stamps, dtype=np.uint64)
        self.latest_probes = np.zeros(probe_words, dtype=np.uint64)
        self.latest_frame: int | None = None
        self.current_frame = 0
        self._published = 0  # the device frame number of the values held
        self._launched = 0  # launches of this graph
        #: While True, ``value``/``age`` do not poll: a reader taking several values (``Engine.stats``)
        #: gets them all from one frame.
        self.frozen = False
        nbytes = 8 * self.slot_words * RING_FRAMES
        self._host = 0
        self._releases = Releases()
        what = f"ReadbackRing ({count} counters, {stamps} stamps)"
        self._arm(what, releases=self._releases, context=ContextRef.current())
        try:
            # Its free waits for the device, so the publish kernel of a graph still in flight
            # finishes writing the ring before it is freed (also when the finalizer frees it).
            self._host, self.ring_device_ptr = self._releases.mapped_host(nbytes)
            ring = (ctypes.c_uint64 * (self.slot_words * RING_FRAMES)).from_address(self._host)
            self._ring = np.ctypeslib.as_array(ring).reshape(RING_FRAMES, self.slot_words)
            self._seq = ring  # scalar reads
            self._frames_dev = frames_ptr  # the device's count of published frames (8 bytes, owned by the graph)
            # On the engine stream: ordered before the graph's first launch.
            check(d.cuMemsetD32Async(frames_ptr, 0, 2, stream or 0), "cuMemsetD32Async")
        except BaseException:
            self.close()  # frees the ring: a failed constructor leaves nothing for the finalizer
            raise

    def publish_args(self, end_stamp: int | None = None) -> tuple[int, int, int, int, int, int]:
        """Arguments of the ``publish`` kernel node: ``(src, words, ring, slot_words, frames,
        end_stamp)``; ``end_stamp`` 0 writes no timestamp (slot 0 is the graph's start).

        Raises:
            CudapatchError: the ring is closed.
        """
        self._check_open("ReadbackRing.publish_args")
        return (self.device_ptr, self.words, self.ring_device_ptr, self.slot_words, self._frames_dev, end_stamp or 0)

    def record(self, frame: int) -> None:
        """Count a launch of the graph as engine frame ``frame`` (no driver call: the graph publishes)."""
        self._launched += 1
        self.current_frame = frame

    def poll(self) -> bool:
        """Take the newest completely published frame, if newer than the one held. Never waits, makes
        no driver call (about a microsecond of Python: call it when values are needed).

        Returns:
            Whether new values arrived.
        """
        if self._closed:  # the ring's memory is gone (closed or abandoned)
            return False
        seq, sw = self._seq, self.slot_words
        for _ in range(RING_FRAMES):  # a slot cleared while copied is retried; older ones follow
            slot = newest_published([seq[s * sw + 1] for s in range(RING_FRAMES)], self._published)
            if slot is None:
                return False
            frame = seq[slot * sw + 1]
            row = self._ring[slot].copy()
            if seq[slot * sw + 1] != frame or int(row[1]) != frame:  # the writer cleared it meanwhile
                continue
            raw = row[2 : 2 + self.words].view(np.uint8)[: self.nbytes]
            self.latest_stamps[:] = raw[: 8 * self.stamps].view(np.uint64)
            self.latest[:] = raw[8 * self.stamps :].view(np.uint32)
            if self.probe_words:
                self.latest_probes[:] = row[2 + self._probes_at : 2 + self.words]
            # Device frame numbers count this graph's launches: map back to engine frames.
            self.latest_frame = self.current_frame - (self._launched - frame)
            self._published = frame
            return True
        return False

    def value(self, index: int) -> int | None:
        """The value at ``index`` in the newest published frame, or None before any completed."""
        if not self.frozen:
            self.poll()
        return None if self.latest_frame is None else int(self.latest[index])

    def age(self) -> int | None:
        """How many frames old the values are (1 = the frame of the last launch)."""
        if not self.frozen:
            self.poll()
        return None if self.latest_frame is None else self.current_frame - self.latest_frame + 1

    def _release(self) -> None:
        """Free the ring (``close``; call it once the graph that publishes into it is idle).

        Raises:
            CudaError: cuMemFreeHost failed.
        """
        self._host = self._frames_dev = 0
        self._releases.release()

    def _forget(self) -> None:
        self._host = self._frames_dev = 0
        self._releases.forget()

    def __repr__(self) -> str:
        return f"<ReadbackRing counters={self.count} stamps={self.stamps} closed={self._closed}>"
