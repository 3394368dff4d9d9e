"""realize(plan) → CompiledGraph: the driver side of a GraphPlan.

``GraphBuilder`` makes the driver objects of one plan, in phases: buffers (reusing the running
graph's allocations, so pointers and the views users hold stay stable across a rebuild), the
readback block (timestamps and append counters, brought back by one async copy per frame),
device-scalar slots of captured calls, one graph node per plan node (``nodes.NODE_KINDS``), the
programmatic edges of the profiling nodes, and instantiation, or, on the frame thread when the
running graph has the same topology, ``cuGraphExecUpdate`` of the running executable (a tenth of the
time; ``warm.same_topology``). It hands everything to the executable
``CompiledGraph`` (``executable.py``), which the engine launches and patches; the builder keeps
nothing.

A failed build leaves the running graph as it was: storage borrowed from it is restored, and
everything made so far is freed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import CudaOutOfMemoryError
from ..kernels._driver import check, driver
from ..kernels.pacing import checkpoint
from ..kernels.types import DType
from .buffers import AppendBuffer, BufferPool, GpuBuffer
from .captured_calls import CapturedCalls, DeviceScalars
from .child_graphs import add_grouped_nodes
from .context import ExternalBinding
from .device import DeviceContext
from .executable import CompiledGraph, GraphParts, Handover
from .libraries import LibraryHandles
from .memory_check import device_free_bytes, lends, memory_shortfall
from .nodes import NodeBuild, add_node, make_conditions
from .params import StoreLoans
from .phases import Phases, lending_keys, second_phase
from .plan import GraphPlan, programmatic_edges
from .probes import PROBE_SCRATCH_WORDS
from .readback import ReadbackRing
from .warm import same_topology

__all__ = ["CompiledGraph", "GraphBuilder", "realize"]


def programmatic_enabled(device: DeviceContext) -> bool:
    """Whether graphs on ``device`` get programmatic edges for their profiling nodes (compute
    capability 9.0 and up; ``CUDAPATCH_PROGRAMMATIC_EDGES=0`` turns them off, for comparisons)."""
    return device.compute_capability >= (9, 0) and os.environ.get("CUDAPATCH_PROGRAMMATIC_EDGES", "1") != "0"


def _add_programmatic(graph: Any, node: Any, sources: list[tuple[Any, str]]) -> None:
    d = driver()
    ports = {
        "programmatic": d.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC,
        "launch_order": d.CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER,
    }
    edges = []
    for _, port in sources:
        e = d.CUgraphEdgeData()
        e.type = d.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
        e.from_port = ports[port]
        edges.append(e)
    froms = [h for h, _ in sources]
    check(d.cuGraphAddDependencies(graph, froms, [node] * len(froms), edges, len(froms)), "cuGraphAddDependencies")


#: Graphs of fewer nodes instantiate without waiting for the end of a frame (``pace``). While a
#: build instantiates, a frame's ``cuGraphLaunch`` waits for the driver's lock: measured beside raw
#: launches at 60 fps (``bench_liveness.py``, "bare build beside launches", H100 host, driver 580),
#: the slowest launch took 0.04 ms during builds of 100 nodes, 0.22 ms of 1,000 and 13.9 ms of
#: 10,000. Waiting for a frame's end cost every build up to a frame: an added block of a 1,000-block
#: chain went live in 4 frames, not 3.
PACE_FROM_NODES = 2_000


class GraphBuilder:
    """Builds the ``CompiledGraph`` of one plan; see ``realize`` for the arguments. One use: ``build()``."""

    def __init__(
        self,
        plan: GraphPlan,
        *,
        device: DeviceContext,
        pool: BufferPool,
        functions: Mapping[tuple[int, int], Any],
        bindings: Mapping[tuple[int, str], ExternalBinding],
        block_names: Mapping[int, str] | None = None,
        previous: CompiledGraph | None = None,
        occupancy: bool = False,
        stamp_function: Any = None,
        libraries: LibraryHandles | None = None,
        publish_function: Any = None,
        lend_stores: bool = True,
        update_previous: bool = False,
        probe_function: Any = None,
        upload_stream: Any = None,
        pace: Callable[[], Any] | None = None,
        on_generalize: Callable[[], Any] | None = None,
    ) -> None:
        self.plan = plan
        self.pace = pace
        self.on_generalize = on_generalize
        self.probe_function = probe_function
        self.lend_stores = lend_stores
        self.update_previous = update_previous
        self.upload_stream = upload_stream
        self.device = device
        self.pool = pool
        self.functions = functions
        self.bindings = bindings
        self.names = block_names or {}
        self.previous = previous if previous is not None and not previous.is_closed else None
        self.specialized: dict[tuple[int, int], Any] = {}  # the previous graph's, taken at ``build``
        self.occupancy = occupancy
        self.stamp_function = stamp_function
        self.libraries = libraries
        self.publish_function = publish_function

    def build(self) -> CompiledGraph:
        """Make the driver objects and instantiate the graph.

        Raises:
            CudaOutOfMemoryError: the plan needs more new device memory than is free (checked before
                anything is allocated: ``memory_check``), or an allocation failed.
            KernelLoadError: a kernel has no function (``.block`` names the block).
            LibraryCallError: a library call failed or cannot be captured (``.block`` names the block).
            CudaError: a driver call failed (nothing is leaked, ``previous`` is untouched).
        """
        d = driver()
        self.device.make_current()
        prev = self.previous
        lent = prev.lendable_buffers() if prev is not None else {}
        # Its specialised kernels, read before its storages are lent and loaded with this plan's values
        # (a build on the frame thread): the nodes that run the same code with the same values keep them.
        self.specialized = prev.specializations() if prev is not None else {}
        self._check_memory(lent)  # before anything is allocated or borrowed
        # What the previous graph lends: nothing of it is modified unless this graph is built; a
        # failure restores what was touched.
        # Parameter storage is lent only by a graph the frame thread is not patching meanwhile: a build on
        # the build thread would rewrite the slots a Hot update of the running graph sends to the driver.
        parts = GraphParts(self.device, CapturedCalls(self.libraries))
        loans = StoreLoans(prev.lendable_stores() if prev is not None and self.lend_stores else {}, parts.token)
        exec_: Any = None
        exec1: Any = None
        t0 = time.perf_counter()
        try:
            fresh = self._buffers(parts, lent)
            if prev is not None:
                parts.handover = Handover.work_out(prev, parts.borrowed)
            stamps_ptr = self._readback(parts)
            parts.scalars = DeviceScalars(self.plan.nodes, self.pool, self.device)
            if parts.scalars.buffer is not None:
                parts.owned.append(parts.scalars.buffer)
            t1 = time.perf_counter()
            parts.graph = check(d.cuGraphCreate(0), "cuGraphCreate")
            handles = self._nodes(parts, loans, stamps_ptr)
            t2 = paced = time.perf_counter()
            taken = None
            if self.update_previous and prev is not None and same_topology(prev.plan, self.plan):
                taken = prev.exec_update(parts.graph)  # last: the running executable now runs this graph
            if taken is not None:
                exec_, original, taken_handles = taken
                parts.take_over(original, taken_handles)
            else:
                if self.pace is not None and len(self.plan.nodes) >= PACE_FROM_NODES:
                    # the driver's lock taken right after a frame, not during the next
                    self.pace()
                    paced = time.perf_counter()
                exec_ = check(d.cuGraphInstantiate(parts.graph, 0), "cuGraphInstantiate")
            phases = None
            if self.plan.delays:  # FrameDelay feedback: a second executable with the pairs swapped
                if self.plan.swaps:  # delays carried by copy nodes (a patch with regions) need no second one
                    exec1 = check(d.cuGraphInstantiate(parts.graph, 0), "cuGraphInstantiate")
                phases = self._phases(parts, handles, (exec_, exec_ if exec1 is None else exec1), fresh)
            t3 = time.perf_counter()
            if taken is None and self.upload_stream is not None:
                # The first launch of a new executable graph uploads it, on the launching thread: 0.3 s
                # for 10,000 nodes (measured on the H200 host). Here, it is the build thread's time.
                for ex in (exec_, exec1):
                    if ex is not None:
                        check(d.cuGraphUpload(ex, self.upload_stream), "cuGraphUpload")
            t4 = time.perf_counter()
            timing = {
                "buffers_ms": (t1 - t0) * 1e3,
                "nodes_ms": (t2 - t1) * 1e3,
                "pace_ms": (paced - t2) * 1e3,  # waiting for the end of a frame
                "instantiate_ms": (t3 - paced) * 1e3,
                "upload_ms": (t4 - t3) * 1e3,
            }
            return CompiledGraph(
                self.plan,
                parts,
                exec_,
                timing=timing,
                phases=phases,
                updated=taken is not None,
                on_generalize=self.on_generalize,
            )
        except BaseException:
            loans.restore()  # the previous graph keeps running with its values intact
            for ex in (exec_, exec1):
                if ex is not None:
                    d.cuGraphExecDestroy(ex)
            parts.release()
            raise

    def _check_memory(self, lent: dict[tuple[int, str], GpuBuffer]) -> None:
        short = memory_shortfall(
            self.plan,
            free_bytes=device_free_bytes(),
            idle_bytes=self.pool.idle_bytes,
            lent={key: (buf.dtype, buf.capacity_bytes) for key, buf in lent.items()},
            names=self.names,
        )
        if short is not None:
            block = self.names.get(short.block_id) if short.block_id is not None else None
            raise CudaOutOfMemoryError(short.message(self.names), name="CUDA_ERROR_OUT_OF_MEMORY", block=block)

    def _phases(self, parts: GraphParts, handles: list[Any], execs: tuple[Any, Any], fresh: set[int]) -> Phases:
        """Patch the second executable into phase 1 and disable every init node in both (see
        ``phases.py``); the delays in ``fresh`` write their start value at the first launch."""
        plan = self.plan
        second_phase(
            plan,
            execs[1],
            handles,
            parts.nodes,
            self.functions,
            parts.buffers,
            self.bindings,
            parts.counters_ptr,
            self.device.context,
            probes=self._build,
        )
        set_enabled = driver().cuGraphNodeSetEnabled
        inits = [handles[dp.node] if dp.node is not None else None for dp in plan.delays]
        both = execs if execs[1] is not execs[0] else execs[:1]  # one executable where delays are copied
        for h in inits:
            if h is not None:
                for ex in both:
                    check(set_enabled(ex, h, 0), "cuGraphNodeSetEnabled")
        return Phases(plan, execs, inits, fresh)

    def _buffers(self, parts: GraphParts, lent: dict[tuple[int, str], GpuBuffer]) -> set[int]:
        """One buffer per planned buffer: the previous graph's allocation where it fits (borrowed until
        ``adopt``), else a new one from the pool.

        Returns:
            The delays (indices into ``plan.delays``) whose state is new: a buffer of the pair was
            allocated here or changed its element count, so the start value must be written.
        """
        stream = self.device.stream
        plan = self.plan
        keys = lending_keys(plan) if plan.delays else None
        new: set[int] = set()
        for b in plan.buffers:
            checkpoint()  # on the build thread: a frame that runs now first (``pacing.FrameGuard``)
            old = lent.pop(keys[b.index] if keys is not None else (b.block_id, b.label), None)
            if old is not None and lends(b, old.dtype, old.capacity_bytes):
                parts.buffers.append(old)
                parts.borrowed.append((old, b.count))
                if old.count != b.count:
                    new.add(b.index)
            else:
                buf = GpuBuffer(self.pool, b.dtype, b.count, stream=stream)
                parts.buffers.append(buf)
                parts.owned.append(buf)
                new.add(b.index)
        return {i for i, dp in enumerate(plan.delays) if dp.previous in new or dp.current in new}

    def _readback(self, parts: GraphParts) -> int:
        """One readback block per graph: timestamps (uint64), then append counters (uint32), then probe
        records (uint64 words), then the frame count, so the publish node brings them all back through
        the ring in one copy per frame. Probes also get their scratch (zeroed once, here).

        Returns:
            The device address of the timestamp slots (0 without readback).
        """
        plan = self.plan
        n_stamps, n_counters, n_probe = plan.stamp_count, len(plan.counters), plan.probe_words
        if not (n_stamps or n_counters or n_probe):
            return 0
        words = n_stamps + (n_counters + 1) // 2 + n_probe
        parts.counters = block = GpuBuffer(self.pool, DType.UINT64, words + 1, stream=self.device.stream)  # +1: frames
        parts.owned.append(block)
        parts.counters_ptr = counters_ptr = block.ptr + 8 * n_stamps
        parts.readback = ReadbackRing(
            block.ptr,
            n_counters,
            stamps=n_stamps,
            frames_ptr=block.ptr + 8 * words,
            stream=self.device.stream,
            probe_words=n_probe,
        )
        if plan.probes:
            parts.probes_ptr = block.ptr + 8 * (words - n_probe)
            # Each probe's finished-blocks counter starts at 0 (its last block resets it every frame).
            scratch_words = PROBE_SCRATCH_WORDS * len(plan.probes)
            scratch = GpuBuffer(self.pool, DType.UINT64, scratch_words, stream=self.device.stream)
            parts.owned.append(scratch)
            scratch.fill_bytes(0)  # on the engine stream: ordered before the graph's first launch
            parts.probe_scratch_ptr = scratch.ptr
        for key, (bi, ci) in plan.appends.items():
            parts.appends[key] = AppendBuffer(parts.buffers[bi], counters_ptr + 4 * ci, ci, parts.readback)
        return block.ptr

    def _nodes(self, parts: GraphParts, loans: StoreLoans, stamps_ptr: int) -> list[Any]:
        """Add every plan node through its kind, then its programmatic edges (profiling nodes on GPUs
        that have them: see ``plan.programmatic_edges``). Returns the node handles, by plan index."""
        plan = self.plan
        build = NodeBuild(
            graph=parts.graph,
            device=self.device,
            buffers=parts.buffers,
            bindings=self.bindings,
            functions=self.functions,
            names=self.names,
            stores=loans,
            calls=parts.calls,
            scalars=parts.scalars,
            libraries=self.libraries,
            readback=parts.readback,
            counters_ptr=parts.counters_ptr,
            stamps_ptr=stamps_ptr,
            stamp_function=self.stamp_function,
            publish_function=self.publish_function,
            probe_function=self.probe_function,
            probes_ptr=parts.probes_ptr,
            probe_scratch_ptr=parts.probe_scratch_ptr,
            occupancy=parts.occupancy if self.occupancy else None,
            launches=parts.launches,
            specialized=self.specialized,
        )
        build.root = parts.graph
        if plan.regions:
            make_conditions(build, plan.nodes)
        timed = plan.stamp_count or plan.counters or plan.probes  # the graphs with profiling or readback nodes
        edges = programmatic_edges(plan.nodes) if timed and programmatic_enabled(self.device) else {}
        if plan.children:  # composites realized as child-graph nodes
            parts.nodes.extend(add_grouped_nodes(build, plan, edges, _add_programmatic))
            self._build = build
            # Kernel nodes' handles (what a FrameDelay's second phase patches; no group holds a delay's nodes).
            return [getattr(n, "handle", None) for n in parts.nodes]
        scopes, bodies = plan.scopes, build.bodies
        handles: list[Any] = []
        for node in plan.nodes:
            checkpoint()
            # A region's body nodes go into its conditional node's body graph (made just before them).
            in_body = bool(scopes) and node.index in scopes
            graph = bodies[scopes[node.index]] if in_body else parts.graph
            build.graph = graph
            # Programmatic edges only in the top-level graph: the conditional-body rules name node
            # types, not edge types, and nothing measured them there (a probe in a body waits plainly).
            special = None if in_body else edges.get(node.index)
            deps = [handles[i] for i in node.deps if not special or i not in special]
            h, runtime = add_node(build, node, deps)
            if runtime is not None and in_body and hasattr(runtime, "body"):
                runtime.body = graph
            parts.nodes.append(runtime)
            parts.handles.append(h)
            if special:
                _add_programmatic(graph, h, [(handles[i], port) for i, port in special.items()])
            handles.append(h)
        self._build = build  # a FrameDelay's second phase makes its probes' launches with it
        return handles


def realize(
    plan: GraphPlan,
    *,
    device: DeviceContext,
    pool: BufferPool,
    functions: Mapping[tuple[int, int], Any],
    bindings: dict[tuple[int, str], ExternalBinding],
    block_names: dict[int, str] | None = None,
    previous: CompiledGraph | None = None,
    occupancy: bool = False,
    stamp_function: Any = None,
    libraries: LibraryHandles | None = None,
    publish_function: Any = None,
    lend_stores: bool = True,
    update_previous: bool = False,
    probe_function: Any = None,
    upload_stream: Any = None,
    pace: Callable[[], Any] | None = None,
    on_generalize: Callable[[], Any] | None = None,
) -> CompiledGraph:
    """Make the driver objects for ``plan``: buffers from the pool, modules from the cache, the graph.

    ``previous`` (the graph running now) lends its output allocations and parameter storage; call
    ``adopt(previous)`` on the result once it replaces ``previous``. ``lend_stores=False`` when
    ``previous`` keeps running and taking Hot updates while this builds (a build off the frame
    thread): its parameter storage is then left alone and every node gets its own.

    ``update_previous`` (frame thread only, between launches): where ``previous`` has the plan's
    topology, update its executable with the new graph (``cuGraphExecUpdate``) instead of
    instantiating; the result then runs in that executable (``instantiations == 0``, ``exec_updates
    == 1``) and ``previous`` runs nothing any more. The driver refusing the update falls back to
    instantiation.

    ``functions`` maps ``(block_id, kernel index)`` to the loaded ``CUfunction`` (from the engine's
    background builder). ``libraries`` (the engine's ``LibraryHandles``) captures library calls.
    ``probe_function`` is the probe kernel, for a plan with probes.
    ``upload_stream``: upload the executable graph to the device on this stream (``cuGraphUpload``)
    here, so that its first launch (on the frame thread) does not do it (``DeviceContext.upload_stream``).
    ``pace`` (a build off the frame thread): called before the instantiation of a graph of
    ``PACE_FROM_NODES`` or more, it returns at the end of a frame (``FrameGate.next_frame``), so that
    the driver's lock is taken between two frames. ``on_generalize``: the graph's ``on_generalize`` (the
    engine's ``Specializer.arm``).

    Raises:
        KernelLoadError: a kernel has no function (``.block`` names the block).
        LibraryCallError: a library call failed or cannot be captured (``.block`` names the block).
        CudaError: a driver call failed (nothing is leaked: partial work is undone, ``previous`` is untouched).
    """
    return GraphBuilder(
        plan,
        device=device,
        pool=pool,
        functions=functions,
        bindings=bindings,
        block_names=block_names,
        previous=previous,
        occupancy=occupancy,
        stamp_function=stamp_function,
        libraries=libraries,
        publish_function=publish_function,
        lend_stores=lend_stores,
        update_previous=update_previous,
        probe_function=probe_function,
        upload_stream=upload_stream,
        pace=pace,
        on_generalize=on_generalize,
    ).build()
