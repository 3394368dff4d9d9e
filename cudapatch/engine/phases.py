"""Two phases of one executable graph: how FrameDelay feedback alternates its buffers for free.

A plan with delays (``plan.delays``) is compiled once, as phase 0: the block computing a delay's
``In`` writes buffer ``current``, the readers of its ``Out`` read buffer ``previous``. Phase 1 is
the same graph with the two pointers of every pair swapped in every node. ``realize`` instantiates
the ``CUgraph`` twice and patches phase 1's nodes that touch a pair (``cuGraphExecKernelNodeSetParams``
with a second parameter storage, ``cuGraphExecMemsetNodeSetParams``), once per build. Each frame
then launches ``execs[phase]`` and flips ``phase``: the same host work at 1 delay or 1,000, and no
copy on the GPU. (The other design, kernels reading their pointers from device memory, would need
every kernel written for it; user kernels take plain pointers.)

The price is paid by edits, not frames: every Hot, Warm and Code update is applied to both
executables (``CompiledGraph._commit``), about 1.4 µs more per patched node.

A delay's init kernel node (writing ``Init`` or ``Fill`` into the buffer ``Out`` reads) is disabled
in both executables except for the one launch that needs it: the first frame after the delay's
buffers were allocated, and the frame after ``reset()`` (``cuGraphNodeSetEnabled`` before that
launch and after it; the driver applies such updates to later launches only).

Across a Cold rebuild the pair keeps its allocations (lent under the delay's own keys,
``lending_keys``) and the new graph continues with the old one's phase, so the feedback state
survives edits elsewhere in the patch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..kernels._driver import check, driver
from .buffers import GpuBuffer
from .nodes import KernelNode, RuntimeNode, arg_value, probe_launch
from .params import ParamStorage
from .plan import GraphPlan, KernelNodePlan, MemsetNodePlan, ProbeNodePlan

__all__ = ["Phases", "lending_keys", "phase_nodes", "second_phase"]

_PREVIOUS = "\x00delay-previous"  # lending labels no port or internal link can have
_CURRENT = "\x00delay-current"


def lending_keys(plan: GraphPlan) -> list[tuple[int, str]]:
    """The key each buffer of ``plan`` is lent and borrowed under across a rebuild: ``(block_id,
    label)``, except a delay's pair, which is keyed by the delay (its state survives the block
    computing ``In`` being replaced)."""
    keys = [(b.block_id, b.label) for b in plan.buffers]
    for dp in plan.delays:
        keys[dp.previous] = (dp.block_id, _PREVIOUS)
        if dp.current is not None:
            keys[dp.current] = (dp.block_id, _CURRENT)
    return keys


class Phases:
    """The alternation of a graph with delays: its two executables, the phase launched next, and
    the init nodes armed for that launch.

    Args:
        plan: The plan both executables run.
        execs: ``(phase 0, phase 1)`` executables.
        inits: The init node handle of each delay of ``plan.delays`` (None: the delay faulted).
        fresh: Indices (into ``plan.delays``) of delays whose buffers are new: their start value is
            written at the first launch.
    """

    __slots__ = ("execs", "phase", "inits", "pending", "resets", "swaps")

    def __init__(self, plan: GraphPlan, execs: tuple[Any, Any], inits: Sequence[Any], fresh: set[int]) -> None:
        self.execs = execs
        self.phase = 0
        self.inits = tuple(inits)
        self.pending = {i for i in fresh if self.inits[i] is not None}
        #: ``(block_id, "Reset")`` -> the delay it re-initialises (a Hot edit of the parameter).
        self.resets = {(dp.block_id, "Reset"): i for i, dp in enumerate(plan.delays)}
        self.swaps = plan.swaps

    def launch(self, launch: Any, stream: Any) -> Any:
        """Launch the executable of the next phase (with any armed init nodes) and flip the phase.

        Returns:
            The driver's error code of the launch (the phase does not flip on an error).

        Raises:
            CudaError: enabling or disabling an init node failed.
        """
        i = self.phase
        ex = self.execs[i]
        armed = self.pending
        if armed:  # the first frame of a delay, or after a reset: its init node runs this once
            self.pending = set()
            self._enable(ex, armed, 1)
        (err,) = launch(ex, stream)
        if not err:
            self.phase = i ^ 1
        if armed:
            self._enable(ex, armed, 0)  # affects later launches only
            if err:
                self.pending = armed
        return err

    def _enable(self, ex: Any, which: set[int], on: int) -> None:
        set_enabled = driver().cuGraphNodeSetEnabled
        for i in which:
            (err,) = set_enabled(ex, self.inits[i], on)
            if err:
                check((err,), "cuGraphNodeSetEnabled")

    def reset(self, changes: Mapping[tuple[int, str], Any]) -> None:
        """Arm the init node of every delay whose ``Reset`` is among ``changes`` (a Hot update)."""
        resets = self.resets
        for key in changes:
            i = resets.get(key)
            if i is not None and self.inits[i] is not None:
                self.pending.add(i)

    def physical(self, index: int) -> int:
        """The buffer that plan buffer ``index`` was in the frame launched last (the two of a pair
        swap every frame)."""
        return self.swaps.get(index, index) if self.phase == 0 else index

    def continue_from(self, previous: Phases | None) -> None:
        """Start where ``previous`` (the graph this one replaces) stopped, so every delay whose pair
        was handed over reads the value written last."""
        if previous is not None:
            self.phase = previous.phase


def second_phase(
    plan: GraphPlan,
    exec1: Any,
    handles: Sequence[Any],
    nodes: Sequence[RuntimeNode],
    functions: Mapping[tuple[int, int], Any],
    buffers: Sequence[GpuBuffer],
    bindings: Mapping[tuple[int, str], Any],
    counters_ptr: int,
    context: Any,
    *,
    probes: Any = None,
) -> None:
    """Patch ``exec1`` (a second instantiation of the plan's graph) into phase 1: every kernel and
    memset node touching a delay's pair gets the other buffer of the pair. A kernel node keeps its
    phase-1 parameter storage as ``KernelNode.alt``, which Hot/Warm/Code updates write beside the
    phase-0 one; a probe on a pair's wire reads the other buffer (``probes``: the build's
    ``NodeBuild``, which keeps the new packed launch alive). (Disabling the init nodes is the
    caller's part.)

    Raises:
        CudaError: a driver call failed.
    """
    d = driver()
    swaps = plan.swaps
    if not swaps:
        return
    swapped = [buffers[swaps.get(i, i)] for i in range(len(buffers))]
    for node in plan.nodes:
        if isinstance(node, KernelNodePlan):
            if not any(a.kind == "buffer" and a.ref in swaps for a in node.args):
                continue
            kn = nodes[node.index]
            assert isinstance(kn, KernelNode)
            values = [arg_value(a, swapped, bindings, counters_ptr) for a in node.args]
            alt = ParamStorage(node, functions[(node.block_id, node.kernel)], values)
            kn.set_alt(alt)
            (err,) = d.cuGraphExecKernelNodeSetParams(exec1, handles[node.index], alt.params)
            if err:
                check((err,), "cuGraphExecKernelNodeSetParams", kernel=node.entry_point)
        elif handles[node.index] is None:  # a node added inside a child graph (the plan has none touching a pair)
            continue
        elif isinstance(node, ProbeNodePlan) and node.buffer in swaps and probes is not None:
            launch = probe_launch(probes, node, swapped[node.buffer].ptr)
            probes.launches.append(launch)
            (err,) = d.cuGraphExecKernelNodeSetParams(exec1, handles[node.index], launch.params)
            if err:
                check((err,), "cuGraphExecKernelNodeSetParams", kernel="probe")
        elif isinstance(node, MemsetNodePlan) and node.buffer is not None and node.buffer in swaps:
            buf = swapped[node.buffer]
            mp = d.CUDA_MEMSET_NODE_PARAMS()
            mp.dst = buf.ptr
            mp.elementSize, mp.width, mp.height, mp.pitch, mp.value = 1, max(buf.nbytes, 1), 1, 0, 0
            check(
                d.cuGraphExecMemsetNodeSetParams(exec1, handles[node.index], mp, context),
                "cuGraphExecMemsetNodeSetParams",
            )


class _SecondPhase:
    """A kernel node launched alone with its phase-1 storage (``replay``)."""

    __slots__ = ("store",)

    def __init__(self, store: ParamStorage) -> None:
        self.store = store

    def launch_alone(self, stream: Any) -> Any:
        return self.store.launch_alone(stream)


def phase_nodes(
    plan: GraphPlan, nodes: Sequence[RuntimeNode], buffers: Sequence[GpuBuffer], phases: Phases
) -> tuple[list[Any], list[GpuBuffer]]:
    """The runtime nodes and buffers a node-by-node replay of the next phase launches (``debug_launch``,
    fault attribution): phase 1's storages and swapped buffers, and no init node that is not armed."""
    idle = {dp.node for i, dp in enumerate(plan.delays) if i not in phases.pending}
    second = phases.phase == 1
    out: list[Any] = []
    for j, n in enumerate(nodes):
        if j in idle:
            out.append(None)
        elif second and isinstance(n, KernelNode) and n.alt is not None:
            out.append(_SecondPhase(n.alt))
        else:
            out.append(n)
    swaps = plan.swaps if second else {}
    return out, [buffers[swaps.get(i, i)] for i in range(len(buffers))]
