"""FrameDelay: feedback from one frame to the next, the one block a link cycle may pass through.

``Out`` is what ``In`` was in the previous frame. The engine keeps two buffers per delay and never
copies between them: the block computing ``In`` writes one while the readers of ``Out`` read the
other, and the two swap roles every frame (the engine launches one of two executable graphs that
differ only in those pointers; see ``docs/architecture.md``, "Feedback"). On the first frame, and
after ``reset()``, the block's one kernel writes ``Init`` (a linked or bound buffer) or, without
one, ``Fill`` into the buffer ``Out`` is read from; on every other frame that kernel node is
disabled in the graph and costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ...kernels.cuda_source import CudaSource
from ...kernels.types import DType, cuda_spelling
from ..block import Block
from ..builder import BlockBuilder
from ..description import BlockDescription, PortSpec, computed
from .transfer import ELEMENT_TYPES

__all__ = ["FrameDelay", "delay_init_source"]


def delay_init_source(dtype: DType) -> CudaSource:
    """The kernel writing a FrameDelay's start value of element type ``dtype``: ``init[i]`` where Init
    is linked (a non-null pointer), else ``fill``."""
    t, header = cuda_spelling(dtype)
    code = header + (
        f'extern "C" __global__ void frame_delay_init(const {t}* init, {t}* out, {t} fill, unsigned int n)\n'
        "{\n"
        "    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) out[i] = init ? init[i] : fill;\n"
        "}\n"
    )
    return CudaSource(code=code, name=f"frame_delay_{dtype.name.lower()}.cu")


def _delay_count(init: int | None, params: Mapping[str, int]) -> int:
    """Init's element count where Init is linked or bound, else ``Count``."""
    return int(init) if init else int(params["Count"])


class FrameDelay(Block):
    """``Out`` is the previous frame's ``In``: feedback (TouchDesigner's Feedback TOP, a one-frame
    delay line). Link a block's output into ``In`` and read ``Out`` upstream of it: the cycle this
    closes is allowed, because it passes through the delay.

    Ports: ``In`` (this frame's value), ``Init`` (optional: the start value), ``Out``. Parameters:
    ``Type`` (element type, text: ``float``, ``float4``, ``uint`` ...), ``Count`` (elements, used
    when Init is not linked), ``Fill`` (the start value without Init; Hot), ``Reset`` (change it to
    write the start value again; ``reset()`` does). ``In`` must carry as many elements of the same
    type as ``Out``; anything else is an error on this block.
    """

    type_name = "FrameDelay"

    def describe(self, b: BlockBuilder) -> None:
        text = b.text(
            "Type", default="float", description="element type: float, float4, int, uint ...", choices=ELEMENT_TYPES
        )
        dtype = DType.from_c_name(text)
        k = b.add_kernel(delay_init_source(dtype))
        b.scalar("Count", dtype=DType.UINT32, default=1024, range=(1, 2**31 - 1), description="elements without Init")
        b.input("Init", k.in_(0), required=False, description="the start value (else Fill)")
        size = computed(_delay_count, "Count", like="Init")
        b.output("Out", k.out(1), size=size, description="the previous frame's In")
        zero = 0.0 if dtype.base.kind == "f" else 0
        b.scalar("Fill", k.in_(2), default=(zero,) * dtype.lanes if dtype.lanes > 1 else zero)
        b.scalar("Reset", dtype=DType.UINT32, default=0, description="change it to write the start value again")
        k.auto_grid(size, count_param=3)

    def _describe(self) -> BlockDescription:
        # ``In`` feeds no kernel of this block: the engine makes the buffer the block computing it
        # writes into the second buffer of the pair, so it is added here, without pins.
        d = super()._describe()
        out = d.output("Out")
        assert out is not None
        feedback = PortSpec("In", "in", "buffer", out.dtype, (), description="this frame's value: Out next frame")
        return replace(d, inputs=(*d.inputs, feedback), feedback=(("In", "Out"),))

    def reset(self) -> None:
        """Write the start value (Init, or Fill) again before the next frame reads ``Out`` (a Hot edit:
        no rebuild)."""
        self.set("Reset", (int(self.get("Reset")) + 1) % 2**32)
