"""An example cudapatch plugin: registers ``example.Wave``, a sine wave generator block, and
``example.Chorus``, a composite of two waves shipped as a file (``chorus.toml``)."""

from __future__ import annotations

from pathlib import Path

from cudapatch import Block, BlockBuilder, DType, from_param
from cudapatch.host_plugin import hookimpl
from cudapatch.kernels.cuda_source import CudaSource

__version__ = "0.1.0"
KERNEL = Path(__file__).with_name("wave.cu")
CHORUS = Path(__file__).with_name("chorus.toml")


class Wave(Block):
    """``Count`` samples of ``Amplitude * sin(2 pi Frequency i / Count + Phase)``."""

    type_name = "Wave"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(CudaSource(path=KERNEL))
        b.scalar("Count", dtype=DType.UINT32, default=1024, range=(1, 1 << 28))
        b.output("Out", k.out(0), size=from_param("Count"))
        b.scalar("Amplitude", k.in_(1), default=1.0)
        b.scalar("Frequency", k.in_(2), default=1.0)
        b.scalar("Phase", k.in_(3), default=0.0)
        k.auto_grid(from_param("Count"), count_param=4)


@hookimpl
def cudapatch_register_blocks(registry):
    registry.add(Wave, name="example.Wave", version=__version__)
    # A sub-patch as a block type: its file is read once every plugin has registered its types.
    registry.add_composite(CHORUS, name="example.Chorus", version=__version__)
