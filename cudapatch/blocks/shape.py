"""Shape: what a port carries beyond its element type, ``(n)``, ``(h, w)`` or ``(d, h, w)`` elements,
optionally with a channel count.

A shape is a value (a NamedTuple: cheap to build, hash and compare; the compiler makes one per value
of the patch on every Cold rebuild). ``count`` is the element count the buffer holds:
``prod(dims) * channels``, in elements of the port's dtype. Channels are interleaved scalars of one
pixel (``uchar`` with 4 channels is RGBA8 as bytes); a vector dtype (``uchar4``, ``float4``) carries
its lanes itself and has 1 channel.

Flat 1-D sizes are shapes too, ``(n,)``: every block written before shapes existed keeps working,
and only blocks that ask for more (a 2-D launch, ``shape_of("Height", "Width")``) see the axes.
"""

from __future__ import annotations

from math import prod
from typing import NamedTuple

__all__ = ["Shape", "shape_from_array"]

_AXES = ("width", "height", "depth")  # from the last axis to the first


class Shape(NamedTuple):
    """Dimensions (outermost first, like NumPy: ``(d, h, w)``) and channels per element position.

    Attributes:
        dims: One to three axis lengths.
        channels: Interleaved scalars per position (1 unless a block says otherwise).
    """

    dims: tuple[int, ...]
    channels: int = 1

    @classmethod
    def of(cls, *dims: int, channels: int = 1) -> Shape:
        """``Shape.of(1080, 1920)`` → ``(1080, 1920)``; ``Shape.of(n)`` → ``(n,)``.

        Raises:
            ValueError: no axis, more than three, a negative length, or fewer than one channel.
        """
        if not 1 <= len(dims) <= 3:
            raise ValueError(f"a shape has 1 to 3 axes, got {len(dims)}")
        out = tuple(int(d) for d in dims)
        if any(d < 0 for d in out):
            raise ValueError(f"a shape's axes cannot be negative: {out}")
        if int(channels) < 1:
            raise ValueError(f"a shape needs at least 1 channel, got {channels}")
        return cls(out, int(channels))

    @classmethod
    def flat(cls, count: int) -> Shape:
        """The 1-D shape ``(count,)``."""
        return cls((max(0, int(count)),), 1)

    @property
    def ndim(self) -> int:
        """Number of axes (1, 2 or 3)."""
        return len(self.dims)

    @property
    def count(self) -> int:
        """Elements the buffer holds: the product of the axes times the channels."""
        return prod(self.dims) * self.channels

    @property
    def width(self) -> int:
        """The last (fastest) axis."""
        return self.dims[-1]

    @property
    def height(self) -> int:
        """The second to last axis (1 for a 1-D shape)."""
        return self.dims[-2] if len(self.dims) >= 2 else 1

    @property
    def depth(self) -> int:
        """The third to last axis (1 for 1-D and 2-D shapes)."""
        return self.dims[-3] if len(self.dims) >= 3 else 1

    def axis(self, name: str) -> int:
        """``width``, ``height``, ``depth`` or ``channels`` by name (``count`` too)."""
        if name == "channels":
            return self.channels
        if name == "count":
            return self.count
        return (self.width, self.height, self.depth)[_AXES.index(name)]

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.dims)
        return dims if self.channels == 1 else f"{dims}x{self.channels}ch"


def shape_from_array(shape: tuple[int, ...], lanes: int) -> Shape | None:
    """The Shape of an array bound to a port whose dtype has ``lanes`` lanes, or None when it is 1-D.

    A trailing axis equal to ``lanes`` is the vector's lanes (a ``(h, w, 4)`` float32 array bound to
    a ``float4`` port is ``(h, w)``); a fourth axis is channels. Arrays of 0 or 1 axes are flat.
    """
    dims = tuple(int(d) for d in shape)
    if lanes > 1 and dims and dims[-1] == lanes:
        dims = dims[:-1]
    if len(dims) <= 1:
        return None
    if len(dims) > 4:
        return None
    if len(dims) == 4:
        return Shape(dims[:3], dims[3])
    return Shape(dims, 1)
