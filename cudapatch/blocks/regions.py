"""Regions: ``If``, ``While`` and ``For``, blocks that hold other blocks and run them conditionally
or repeatedly on the GPU, inside the one graph of the frame.

A region is a block with no kernels of its own. The engine places blocks inside it
(``engine.add(block, region=r)``); its body becomes the body graph of a CUDA conditional node, and
the decision is taken on the device by a tiny set-condition kernel, so a loop costs the host nothing
per iteration:

- ``If``: runs its body once when its ``Condition`` input (a one-element int, uint or uchar buffer
  made by a block *before* the region) is non-zero.
- ``While``: runs its body, then again while ``Condition`` (made by a block *in* the body, re-read
  after every iteration) is non-zero, at most ``Max`` times per frame. A While without ``Max`` is an
  error: a condition that never turns false would hang the GPU. ``Max`` is at least 1: setting 0
  is refused at once (a Hot edit to 0 would otherwise skip the body silently). The body runs at
  least once.
- ``For``: runs its body ``Count`` times per frame. ``Count`` is a Hot parameter: changing it patches
  the running graph, no rebuild.

Regions nest. ``Max`` and ``Count`` are Hot, like any scalar parameter.

``Unroll`` (For and While; structural: a change rebuilds) puts that many copies of the body in one
conditional body, so the device pays its per-iteration cost once per copies. A For stays exact (the
rest runs in a tail loop of one copy); a While checks its condition once per ``Unroll`` iterations,
so it may run up to ``Unroll - 1`` iterations past the one whose condition turned false (never past
``Max``); its iteration count is the number actually run. Defaults: 8 for a For, 1 for a While.

Nothing here imports the engine: the description says what the region is
(``RegionDescription.kind``); the compiler makes its nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..kernels.types import DType
from .block import Block
from .description import BlockDescription, ParamSpec, PortSpec

__all__ = [
    "CONDITION_DTYPES",
    "FOR_UNROLL",
    "MAX_UNROLL",
    "WHILE_UNROLL",
    "For",
    "If",
    "Region",
    "RegionDescription",
    "RegionKind",
    "While",
    "accepts_condition",
]

RegionKind = Literal["if", "while", "for"]

#: Element types a region's ``Condition`` input takes: read as "non-zero is true".
CONDITION_DTYPES = (DType.INT32, DType.UINT32, DType.UINT8)
CONDITION = "Condition"
_UINT_MAX = 2**31 - 1

#: Default ``Unroll`` of a For: its count is exact at any unroll, and 8 copies per loop step cut the
#: device's per-iteration cost of a conditional body (several microseconds) eightfold.
FOR_UNROLL = 8
#: Default ``Unroll`` of a While: 1, so it stops at exactly the iteration whose condition turned false.
WHILE_UNROLL = 1
#: The most copies of a body: each copy is nodes in the graph, so the graph grows with it.
MAX_UNROLL = 64


def _unroll(default: int, what: str) -> ParamSpec:
    """The ``Unroll`` parameter of a loop: structural (a change rebuilds the graph)."""
    return ParamSpec("Unroll", DType.UINT32, default, 1, MAX_UNROLL, structural=True, description=what)


@dataclass(frozen=True)
class RegionDescription(BlockDescription):
    """The description of a region block: no kernels; ``kind`` says which region it is."""

    kind: RegionKind = "if"


def accepts_condition(description: BlockDescription, port: str, dtype: DType) -> bool:
    """Whether ``port`` of ``description`` is a region's ``Condition`` input that takes ``dtype``
    (any of ``CONDITION_DTYPES``: the port is declared int, but uint and uchar (bool) link too)."""
    return isinstance(description, RegionDescription) and port == CONDITION and dtype in CONDITION_DTYPES


class Region(Block):
    """Base of ``If``, ``While`` and ``For``. Subclasses set ``kind``."""

    kind: ClassVar[RegionKind] = "if"
    type_name = "Region"

    def describe(self, b: object) -> None:  # regions are described by ``_describe``: no builder, no kernels
        raise NotImplementedError

    def _describe(self) -> BlockDescription:
        inputs: tuple[PortSpec, ...] = ()
        params: tuple[ParamSpec, ...] = ()
        if self.kind != "for":
            when = "before the If" if self.kind == "if" else "in the While's body (re-read after every iteration)"
            inputs = (
                PortSpec(
                    CONDITION,
                    "in",
                    "buffer",
                    DType.INT32,
                    (),
                    description=f"one int, uint or uchar: non-zero runs the body; made by a block {when}",
                ),
            )
        if self.kind == "while":
            params = (
                ParamSpec(
                    "Max",
                    DType.UINT32,
                    0,  # not given: an error on the region when the graph is built
                    1,  # so a Hot edit to 0 is refused at once, the old value staying
                    _UINT_MAX,
                    description="most iterations per frame (required, at least 1)",
                ),
                _unroll(
                    WHILE_UNROLL,
                    "copies of the body per condition check; above 1 the loop may run up to Unroll-1 "
                    "iterations past the one that turned the condition false (never past Max)",
                ),
            )
        elif self.kind == "for":
            params = (
                ParamSpec("Count", DType.UINT32, 1, 0, _UINT_MAX, description="iterations per frame (Hot)"),
                _unroll(FOR_UNROLL, "copies of the body per loop step (the count stays exact)"),
            )
        return RegionDescription(self.type_name, (), inputs, (), params, kind=self.kind)


class If(Region):
    """Runs the blocks inside it when ``Condition`` (made before the region) is non-zero."""

    kind = "if"
    type_name = "If"


class While(Region):
    """Runs the blocks inside it, then again while ``Condition`` (made inside it) is non-zero, at most
    ``Max`` times a frame (required)."""

    kind = "while"
    type_name = "While"


class For(Region):
    """Runs the blocks inside it ``Count`` times a frame (Hot)."""

    kind = "for"
    type_name = "For"
