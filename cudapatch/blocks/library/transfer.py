"""Upload and Download: data that crosses between host and GPU every frame, without a stall.

``Upload``'s ``Out`` holds the newest array the host wrote into a pinned, device-mapped ring (audio
blocks, sensor frames); ``Download`` copies its ``In`` into another such ring, read on the host a
few frames later. Both are ordinary kernel nodes: the slot is chosen on the GPU when the frame runs
(the newest one written), so the host makes no driver call per frame, and neither side ever waits
for the other. The rings belong to ``cudapatch.engine.transfer`` (``UploadRing``,
``DownloadRing``), which binds them to the blocks' ``Ring`` and ``Control`` ports; see
``docs/blocks.md``, "Feedback and per-frame data".

Each kernel runs as one thread block striding over the data (the newest slot is read once, in
shared memory, so no block sees a newer slot than another): meant for what flows every frame,
up to a few MB.
"""

from __future__ import annotations

from ...kernels.cuda_source import CudaSource
from ...kernels.types import DType, cuda_spelling
from ..block import Block
from ..builder import BlockBuilder
from ..description import fixed, from_param, like

__all__ = ["Download", "Upload", "UPLOAD_SLOTS", "DOWNLOAD_SLOTS", "ELEMENT_TYPES", "c_type"]

#: The choices of a ``Type`` text parameter that picks a generated kernel's element type: every C name.
ELEMENT_TYPES: tuple[str, ...] = tuple(d.c_name for d in DType)

#: Slots of an upload ring: the host may be two uploads ahead of the frame reading one.
UPLOAD_SLOTS = 4
#: Slots of a download ring (the frames in flight, as for the readback ring).
DOWNLOAD_SLOTS = 3


def c_type(dtype: DType) -> str:
    """The C spelling NVRTC knows for ``dtype`` (``uint`` -> ``unsigned int``; see ``cuda_spelling``)."""
    return cuda_spelling(dtype)[0]


def _word(dtype: DType) -> str:
    """The unsigned type the kernels copy ``dtype`` in: volatile loads of the host-mapped ring (the
    ring's slots are rewritten between frames) in units every element type is a whole number of."""
    return (
        "unsigned int"
        if dtype.itemsize % 4 == 0
        else ("unsigned short" if dtype.itemsize % 2 == 0 else "unsigned char")
    )


def _upload_source(dtype: DType) -> CudaSource:
    (t, header), w, per = cuda_spelling(dtype), _word(dtype), dtype.itemsize
    code = (
        header
        + f"""
// control (host-mapped): [0] the newest sequence number the host wrote, [1] the one a frame copies.
extern "C" __global__ void upload_copy(const {t}* ring, /*inout*/ unsigned long long* control, {t}* out,
                                       unsigned int count, unsigned int slots, unsigned int ring_count)
{{
    const unsigned int n = count < ring_count / slots ? count : ring_count / slots;  // a ring made for another Count
    __shared__ unsigned long long seq;
    if (threadIdx.x == 0) {{
        seq = *(volatile unsigned long long*)&control[0];
        *(volatile unsigned long long*)&control[1] = seq;  // the host leaves this slot alone from now on
    }}
    __syncthreads();
    if (seq == 0) return;  // nothing written yet: Out keeps what it holds
    const unsigned long long words = (unsigned long long)n * {per} / sizeof({w});
    const unsigned long long stride = (unsigned long long)(ring_count / slots) * {per} / sizeof({w});
    const volatile {w}* src = (const volatile {w}*)ring + (seq % slots) * stride;
    {w}* dst = ({w}*)out;
    for (unsigned long long i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
}}
"""
    )
    return CudaSource(code=code, name=f"upload_{dtype.name.lower()}.cu")


def _download_source(dtype: DType) -> CudaSource:
    (t, header), w, per, k = cuda_spelling(dtype), _word(dtype), dtype.itemsize, DOWNLOAD_SLOTS
    code = (
        header
        + f"""
// control (host-mapped): [0] frames this block ran, [1 + s] the frame slot s holds (0: not complete).
extern "C" __global__ void download_copy(const {t}* in, /*inout*/ {t}* ring,
                                         /*inout*/ unsigned long long* control, unsigned int n_in,
                                         unsigned int ring_count)
{{
    const unsigned int capacity = ring_count / {k};  // a slot: the Count the ring was made for
    const unsigned int n = n_in < capacity ? n_in : capacity;
    __shared__ unsigned long long frame;
    volatile unsigned long long* ctl = control;
    if (threadIdx.x == 0) frame = ctl[0] + 1;
    __syncthreads();
    const unsigned long long words = (unsigned long long)n * {per} / sizeof({w});
    const unsigned long long stride = (unsigned long long)capacity * {per} / sizeof({w});
    const {w}* src = (const {w}*)in;
    volatile {w}* slot = (volatile {w}*)ring + (frame % {k}) * stride;
    for (unsigned long long i = threadIdx.x; i < words; i += blockDim.x) slot[i] = src[i];
    __syncthreads();
    if (threadIdx.x == 0) {{
        asm volatile("fence.acq_rel.sys;" ::: "memory");  // the data reaches the host before the frame word
        ctl[1 + frame % {k}] = frame;
        ctl[0] = frame;
        ctl[1 + (frame + 1) % {k}] = 0;  // the slot the next frame writes: no longer complete, a frame early
    }}
}}
"""
    )
    return CudaSource(code=code, name=f"download_{dtype.name.lower()}.cu")


def _element_type(b: BlockBuilder) -> DType:
    text = b.text(
        "Type", default="float", description="element type: float, float4, int, uint ...", choices=ELEMENT_TYPES
    )
    return DType.from_c_name(text)


class Upload(Block):
    """``Out``: ``Count`` elements the host writes every frame (or whenever it has new data) through
    ``cudapatch.engine.transfer.UploadRing``; the frame copies the newest complete array. Until the
    first write, ``Out`` is left as it is. ``Ring`` and ``Control`` are bound by the ring."""

    type_name = "Upload"

    def describe(self, b: BlockBuilder) -> None:
        dtype = _element_type(b)
        k = b.add_kernel(_upload_source(dtype))
        b.scalar("Count", dtype=DType.UINT32, default=1024, range=(1, 2**31 - 1), description="elements per upload")
        b.input("Ring", k.in_(0), description="the pinned ring (bound by UploadRing)")
        b.input("Control", k.in_(1), description="the ring's sequence words (bound by UploadRing)")
        b.output("Out", k.out(2), size=from_param("Count"), description="the newest uploaded array")
        k.set_count(3, from_param("Count"))
        k.set_count(4, fixed(UPLOAD_SLOTS))
        k.set_count(5, like("Ring"))


class Download(Block):
    """Copies ``In`` every frame into a pinned ring (``cudapatch.engine.transfer.DownloadRing``),
    read on the host a frame or two later with plain loads: no synchronize, no driver call.
    ``Count``: the elements a slot holds (set it to ``In``'s size; more of ``In`` is left out).
    ``Ring`` and ``Control`` are bound by the ring."""

    type_name = "Download"

    def describe(self, b: BlockBuilder) -> None:
        dtype = _element_type(b)
        k = b.add_kernel(_download_source(dtype))
        b.input("In", k.in_(0), description="the values to read on the host")
        b.input("Ring", k.in_(1), description="the pinned ring (bound by DownloadRing)")
        b.input("Control", k.in_(2), description="the ring's frame words (bound by DownloadRing)")
        b.scalar("Count", dtype=DType.UINT32, default=1024, range=(1, 2**31 - 1), description="elements a slot holds")
        k.set_count(3, like("In"))
        k.set_count(4, like("Ring"))
