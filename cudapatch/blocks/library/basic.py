"""Built-in blocks that prove the path: vector add, scale, fill and an append filter."""

from __future__ import annotations

from ...kernels.source import bundled_kernel
from ...kernels.types import DType
from ..block import Block
from ..builder import BlockBuilder
from ..description import from_param, like

__all__ = ["VectorAdd", "Scale", "Fill", "AppendFilter", "Fusable"]


class Fusable:
    """Mixin of elementwise blocks: ``fuse=False`` keeps the block out of fused groups (its kernel
    runs on its own node, its output has its own buffer)."""

    def __init__(self, *args: object, fuse: bool = True, **kwargs: object) -> None:
        self.fuse = fuse  # read by describe(), which Block.__init__ runs
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]


class VectorAdd(Fusable, Block):
    """``Sum = A + B`` element-wise (float). Output size is A's."""

    type_name = "VectorAdd"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(bundled_kernel("vector_add"))
        b.input("A", k.in_(0))
        b.input("B", k.in_(1))
        b.output("Sum", k.out(2), size=like("A"))
        k.auto_grid(like("A"), count_param=3)
        if self.fuse:
            k.elementwise("A + B")  # vector_add.ptx: add.f32, round to nearest, as the fused add.rn


class Scale(Fusable, Block):
    """``Out = In * Factor + Offset`` element-wise (float). Factor and Offset are Hot parameters."""

    type_name = "Scale"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(bundled_kernel("scale"))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"))
        b.scalar("Factor", k.in_(2), default=1.0)
        b.scalar("Offset", k.in_(3), default=0.0)
        k.auto_grid(like("In"), count_param=4)
        if self.fuse:
            k.elementwise("fma(In, Factor, Offset)")  # scale.ptx has fma.rn.f32: so has the fused kernel


class Fill(Block):
    """A buffer of ``Count`` floats, all equal to ``Value`` (Hot). Changing ``Count`` rebuilds."""

    type_name = "Fill"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(bundled_kernel("fill"))
        b.scalar("Count", dtype=DType.UINT32, default=1024, range=(1, 2**31 - 1))
        b.scalar("Value", k.in_(1), default=0.0)
        b.output("Out", k.out(0), size=from_param("Count"))
        k.auto_grid(from_param("Count"), count_param=2)


class AppendFilter(Block):
    """Appends every element of ``In`` above ``Threshold`` to the append output ``Kept``
    (capacity ``Capacity``; order not kept). The count is read back without stalling the frame."""

    type_name = "AppendFilter"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(bundled_kernel("append_filter"))
        b.input("In", k.in_(0))
        b.scalar("Capacity", dtype=DType.UINT32, default=1 << 16, range=(1, 2**31 - 1))
        b.append_output("Kept", k.out(1), k.out(2), capacity=from_param("Capacity"))
        b.scalar("Threshold", k.in_(3), default=0.5)
        k.auto_grid(like("In"), count_param=4)
        k.set_count(5, from_param("Capacity"))
