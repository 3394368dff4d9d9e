"""Timers shared by the benchmarks: GPU time from CUDA events, host time of a call, of update() and of
a bare launch of the engine's graph (the peer of a quiet update()), and one block's kernel launched
eagerly (the peer of the time the graph reports for it).

The driver's own floor, timed with raw ``cuda.bindings.driver`` calls on the engine's own executable
graph (``engine.graph.handle``, the engine's stream), so a row can print what the driver alone costs
beside what the engine costs: a node's parameters set and the graph launched (the peer of a Hot or
Warm ``update()``), a node turned off or on with its reader's parameters set and the graph launched
(the peer of a bypass toggle), and a graph of the same kernel nodes built on another thread while the
running one launches at 60 fps (what the driver's lock alone costs a launch during a build). Each
holds the engine's graph lock while it touches the executable (the kernel builder's thread swaps
kernels into it between frames) and leaves the graph as it found it."""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver as d

from cudapatch.kernels._driver import check


def gpu_ms_samples(run: Callable[[], Any], stream: Any, frames: int = 200, repeats: int = 5) -> list[float]:
    """GPU time per call of ``run`` (ms), one value per repeat: events around ``frames`` calls, the
    stream drained before each repeat."""
    start, end = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
    out = []
    try:
        for _ in range(repeats):
            check(d.cuStreamSynchronize(stream))
            check(d.cuEventRecord(start, stream))
            for _ in range(frames):
                run()
            check(d.cuEventRecord(end, stream))
            check(d.cuEventSynchronize(end))
            out.append(check(d.cuEventElapsedTime(start, end)) / frames)
    finally:
        check(d.cuEventDestroy(start))
        check(d.cuEventDestroy(end))
    return out


def gpu_ms(run: Callable[[], Any], stream: Any, frames: int = 200, repeats: int = 5) -> float:
    """The median of ``gpu_ms_samples``."""
    return statistics.median(gpu_ms_samples(run, stream, frames, repeats))


def host_us(run: Callable[[], Any], calls: int, sync: Callable[[], Any] | None = None, every: int = 50) -> float:
    """Median host µs of ``run()``; ``sync()`` (untimed) every ``every`` calls and after the last, so a
    full launch queue never blocks a timed call."""
    times = []
    for i in range(calls):
        if sync is not None and i % every == 0:
            sync()
        t = time.perf_counter_ns()
        run()
        times.append(time.perf_counter_ns() - t)
    if sync is not None:
        sync()
    return statistics.median(times) / 1e3


def host_us_side_by_side(
    ours: Callable[[], Any],
    peer: Callable[[], Any],
    calls: int,
    sync: Callable[[], Any],
    rounds: int = 10,
    every: int = 50,
) -> tuple[float, float]:
    """Median host µs of ``ours()`` and of ``peer()``, timed in ``rounds`` alternating runs of
    ``calls / rounds`` calls each (``sync()`` untimed every ``every`` calls): a machine that speeds up
    or slows down during the run (clocks, another tenant) moves both, not one."""
    a: list[int] = []
    b: list[int] = []
    per = max(1, calls // rounds)
    for _ in range(rounds):
        for run, times in ((ours, a), (peer, b)):
            for i in range(per):
                if i % every == 0:
                    sync()
                t = time.perf_counter_ns()
                run()
                times.append(time.perf_counter_ns() - t)
            sync()
    return statistics.median(a) / 1e3, statistics.median(b) / 1e3


def update_us(engine: Any, frames: int = 1000, sync_every: int = 20) -> float:
    """Median host µs of ``engine.update()``, the stream drained every ``sync_every`` frames (this
    measures the host, not a full launch queue)."""
    return host_us(engine.update, frames, engine.synchronize, sync_every)


def update_and_bare_launch_us(engine: Any, frames: int = 1000) -> tuple[float, float]:
    """``update_us`` and ``bare_launch_us`` side by side (``host_us_side_by_side``): a quiet
    ``update()`` and its peer, timed in alternating runs."""
    graph = engine.graph
    assert graph is not None
    bare = functools.partial(graph.launch, engine.resources.stream)
    return host_us_side_by_side(engine.update, bare, frames, engine.synchronize)


def bare_launch_us(engine: Any, frames: int = 500, sync_every: int = 50) -> float:
    """Median host µs of launching the engine's executable graph by itself (``Graph.launch``, no
    ``update()`` around it): the peer of a quiet ``update()``."""
    graph = engine.graph
    assert graph is not None
    return host_us(functools.partial(graph.launch, engine.resources.stream), frames, engine.synchronize, sync_every)


def eager_kernel_ms(
    engine: Any, block_id: int, *, launches: int = 40, rounds: int = 20, behind_a_frame: bool = True
) -> float:
    """Median GPU ms of one launch of block ``block_id``'s first kernel node, launched with
    ``cuLaunchKernel`` as the graph launches it (its function, grid and parameters): ``launches``
    launches between two events per round. ``behind_a_frame``: each round is queued behind a frame of
    the graph, so the GPU runs them back to back even where issuing a launch takes longer than the
    kernel runs (without it, that peer is bound by the host's launch rate)."""
    node = kernel_node(engine, block_id)
    kp, stream = node.params, engine.device.stream
    start, end = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
    out = []
    try:
        for _ in range(rounds):
            if behind_a_frame:
                engine.update()
            check(d.cuEventRecord(start, stream))
            for _ in range(launches):
                args = (kp.kernelParams, kp.extra)  # a pointer per argument, or one buffer (engine/params.py)
                check(d.cuLaunchKernel(kp.func, kp.gridDimX, 1, 1, kp.blockDimX, 1, 1, 0, stream, *args))
            check(d.cuEventRecord(end, stream))
            check(d.cuEventSynchronize(end))
            out.append(check(d.cuEventElapsedTime(start, end)) / launches)
    finally:
        check(d.cuEventDestroy(start))
        check(d.cuEventDestroy(end))
    return statistics.median(out)


# -- the driver's floor on the engine's own executable graph ------------------------------------------


def kernel_nodes(engine: Any) -> list[Any]:
    """The running graph's top-level kernel nodes, in insertion order (the engine's ``KernelNode``
    objects: ``handle``, ``params``, ``plan``); captured library calls and nodes inside a composite's
    child graph or a region's body are left out."""
    graph = engine.graph
    assert graph is not None, "the engine has no graph yet"
    return [
        n
        for n in graph._nodes
        if getattr(n, "params", None) is not None
        and getattr(n, "child", None) is None
        and getattr(n, "body", None) is None
    ]


def kernel_node(engine: Any, block_id: int) -> Any:
    """Block ``block_id``'s first kernel node in the running graph."""
    return next(
        n
        for n in engine.graph._nodes
        if n is not None and getattr(n, "plan", None) is not None and n.plan.block_id == block_id
    )


def patched_node(engine: Any, block_id: int, name: str, *, binding: bool = False) -> Any:
    """The kernel node a Hot change of block ``block_id``'s parameter ``name`` patches in the running
    graph (``binding``: a Warm rebind of its input port ``name``): the first node holding one of its
    slots. In a fused group that is the group's kernel node."""
    graph = engine.graph
    assert graph is not None, "the engine has no graph yet"
    slots = (graph.plan.binding_slots if binding else graph.plan.scalar_slots)[(block_id, name)]
    return graph._nodes[slots[0][0]]


def _quiet_executable(engine: Any) -> tuple[Any, Any]:
    """``(executable, stream)`` of the engine's running graph, checked fit for the bare peers: a graph,
    no build in flight (the build thread would swap it), one executable (FrameDelay graphs alternate
    two), the engine's context current on this thread."""
    graph = engine.graph
    assert graph is not None, "the engine has no graph yet"
    assert not engine.building, "a build is in flight: time the driver's floor on a quiet engine"
    assert getattr(graph, "_phases", None) is None, "a graph with FrameDelays launches two executables"
    engine.device.make_current()
    return graph.handle, engine.resources.stream


def _alternate_medians(
    runs: dict[str, Callable[[], Any]], calls: int, sync: Callable[[], Any], rounds: int = 3
) -> dict[str, float]:
    """``host_us`` of each of ``runs`` (``calls`` calls, ``sync`` every 50), the runs taken in turn
    ``rounds`` times; the median of each one's rounds (a clock or load change between two runs then
    shifts both)."""
    out: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            out[name].append(host_us(run, calls, sync))
    return {name: statistics.median(v) for name, v in out.items()}


def bare_set_params_launch_us(engine: Any, node: Any, calls: int = 2000) -> tuple[float, float]:
    """Host µs of what the driver alone does for a Hot or Warm ``update()``, on the engine's own
    executable: ``cuGraphExecKernelNodeSetParams`` of ``node`` (a ``KernelNode`` of the running graph,
    e.g. from ``patched_node``) with the parameters it holds, then ``cuGraphLaunch``.

    Returns:
        ``(set params + launch, launch alone)``: medians of the same run (the caller prints the
        difference, the driver's cost of the patch beyond a frame). The graph is left as it was (its
        parameters written again unchanged).
    """
    with engine._graph_lock:
        exec_, stream = _quiet_executable(engine)
        launch, set_params = d.cuGraphLaunch, d.cuGraphExecKernelNodeSetParams
        handle, params = node.handle, node.params
        check(set_params(exec_, handle, params))  # the call shapes, checked once; the timed calls unchecked
        check(launch(exec_, stream))
        medians = _alternate_medians(
            {
                "launch": lambda: launch(exec_, stream),
                "set": lambda: (set_params(exec_, handle, params), launch(exec_, stream)),
            },
            calls,
            engine.synchronize,
        )
        check(set_params(exec_, handle, node.params))
        engine.synchronize()
    return medians["set"], medians["launch"]


def bare_bypass_toggle_us(engine: Any, node: Any, reader: Any, calls: int = 2000) -> tuple[float, float]:
    """Host µs of what the driver alone does for a bypass toggle, on the engine's own executable:
    ``cuGraphNodeSetEnabled`` of ``node`` (the bypassed block's kernel node), on and off in turn, then
    ``cuGraphExecKernelNodeSetParams`` of ``reader`` (the node reading its output, redirected by a
    bypass) with its pointer to the block's input and to the block's output in turn, as the engine's
    toggle writes them (the driver does less for parameters that did not change), then ``cuGraphLaunch``.

    Returns:
        ``(toggle + launch, launch alone)``: medians of the same run. Afterwards ``node`` is enabled
        or not as the engine has it (disabled only where the engine's bypass turned it off) and
        ``reader`` holds the engine's current parameters: the graph is as it was found.
    """
    with engine._graph_lock:
        exec_, stream = _quiet_executable(engine)
        graph = engine.graph
        index = next(i for i, n in enumerate(graph._nodes) if n is node)
        engine_state = 0 if index in graph.bypass.disabled else 1
        launch, set_params, set_enabled = d.cuGraphLaunch, d.cuGraphExecKernelNodeSetParams, d.cuGraphNodeSetEnabled
        handle, reader_handle, reader_params = node.handle, reader.handle, reader.params
        state = [engine_state]
        # The reader's pointers in each state: as they are now, and as the engine's step to the other
        # state writes them (``_BypassStep.direct``: the buffers it reads when not redirected).
        back = graph._bypass_back
        assert back is not None and back.direct is not None and back.one is reader, "a toggle's direct step"
        pointers = [(slot, {engine_state: slot.value, 1 - engine_state: buf.ptr}) for slot, buf in back.direct]
        assert any(values[0] != values[1] for _, values in pointers), "the toggle moves the reader's pointer"

        def toggle() -> None:
            on = state[0] = state[0] ^ 1
            set_enabled(exec_, handle, on)
            for slot, values in pointers:
                slot.value = values[on]
            set_params(exec_, reader_handle, reader_params)
            launch(exec_, stream)

        try:
            check(set_enabled(exec_, handle, 1 - engine_state))  # the call shapes, checked once
            check(set_enabled(exec_, handle, engine_state))
            check(set_params(exec_, reader_handle, reader_params))
            check(launch(exec_, stream))
            medians = _alternate_medians(
                {"launch": lambda: launch(exec_, stream), "toggle": toggle}, calls, engine.synchronize
            )
        finally:
            check(set_enabled(exec_, handle, engine_state))
            for slot, values in pointers:
                slot.value = values[engine_state]
            check(set_params(exec_, reader_handle, reader.params))
            engine.synchronize()
    return medians["toggle"], medians["launch"]


def bare_patch_every_node_us(engine: Any, repeats: int = 5) -> float:
    """Host µs of what the driver alone does for a Warm patch that changes every node (a growth of a
    chain): ``cuGraphExecKernelNodeSetParams`` of each top-level kernel node of the running graph,
    then ``cuGraphLaunch``. Each node's parameters differ from what the executable holds (its grid
    one block larger, then back), since the driver does less for parameters that did not change; the
    chain's kernels guard their index, so the extra block does nothing. The smallest of ``repeats``
    patches; the graph is left as it was."""

    def copy(p: Any, extra_block: int) -> Any:
        q = d.CUDA_KERNEL_NODE_PARAMS()
        q.func, q.sharedMemBytes, q.kernelParams, q.extra = p.func, p.sharedMemBytes, p.kernelParams, p.extra
        q.gridDimX, q.gridDimY, q.gridDimZ = p.gridDimX + extra_block, p.gridDimY, p.gridDimZ
        q.blockDimX, q.blockDimY, q.blockDimZ = p.blockDimX, p.blockDimY, p.blockDimZ
        return q

    with engine._graph_lock:
        exec_, stream = _quiet_executable(engine)
        nodes = kernel_nodes(engine)
        sets = [[(n.handle, copy(n.params, k)) for n in nodes] for k in (1, 0)]  # changed, then back
        set_params, launch = d.cuGraphExecKernelNodeSetParams, d.cuGraphLaunch
        best = float("inf")
        try:
            for r in range(2 * repeats):
                engine.synchronize()
                t = time.perf_counter_ns()
                for handle, params in sets[r % 2]:
                    (err,) = set_params(exec_, handle, params)
                    if err:
                        check((err,), "cuGraphExecKernelNodeSetParams")
                check(launch(exec_, stream))
                best = min(best, (time.perf_counter_ns() - t) / 1e3)
        finally:
            for n in nodes:  # the engine's own values again
                check(set_params(exec_, n.handle, n.params))
            engine.synchronize()
    return best


def _split(nodes: list[Any], split: int | None) -> list[list[Any]]:
    """``nodes`` in runs of at most ``split`` (all in one when ``split`` is None)."""
    if not split:
        return [nodes]
    return [nodes[i : i + split] for i in range(0, len(nodes), split)]


def _chained_graph(nodes: list[Any]) -> Any:
    """A new graph of ``nodes``' kernel launches (their parameters), each depending on the one before."""
    graph = check(d.cuGraphCreate(0))
    try:
        prev: list[Any] = []
        for n in nodes:
            prev = [check(d.cuGraphAddKernelNode(graph, prev, len(prev), n.params))]
    except BaseException:
        check(d.cuGraphDestroy(graph))
        raise
    return graph


def bare_build_beside_launches(
    engine: Any, repeats: int = 10, fps: float = 60.0, pause_s: float = 0.003, split: int | None = None
) -> tuple[float, int, dict[str, float]]:
    """What the driver's lock alone costs a frame during a build: a thread builds, ``repeats`` times, a
    graph of the running graph's kernel nodes (``kernel_nodes``: ``cuGraphAddKernelNode`` each, chained,
    with the engine's parameters), instantiates it, uploads it on the engine's stream and destroys it,
    ``pause_s`` between builds; meanwhile this thread launches the engine's executable with a raw
    ``cuGraphLaunch`` at ``fps`` and records each launch's host time. No engine code runs during it:
    the peer of the slowest ``update()`` during a structure edit.

    With ``split``, the same nodes are built as several graphs of at most ``split`` nodes (the graph a
    patch split into several executables would build), each instantiated and uploaded right after a
    frame's launch: what splitting would save the frame (its cost to a quiet frame:
    ``bare_split_launch_us``).

    Returns:
        ``(slowest launch µs, frames launched, median ms of each build phase)``, the phases ``add``
        (create the graph and add the nodes), ``instantiate`` and ``upload``.

    Raises:
        CudaError: a driver call failed (on the build thread: raised here after it ended).
    """
    with engine._graph_lock:
        exec_, stream = _quiet_executable(engine)
        parts = _split(kernel_nodes(engine), split)
        context = engine.device.context
        done, stop, frame = threading.Event(), threading.Event(), threading.Event()
        failed: list[BaseException] = []
        phases: dict[str, list[float]] = {"add": [], "instantiate": [], "upload": []}

        def build() -> None:
            try:
                check(d.cuCtxSetCurrent(context))
                for _ in range(repeats):
                    if stop.is_set():  # the launch loop failed: no more builds
                        break
                    graphs: list[Any] = []
                    try:
                        t0 = time.perf_counter()
                        for part in parts:
                            graphs.append(_chained_graph(part))
                        t1 = time.perf_counter()
                        instantiate = upload = 0.0
                        for graph in graphs:
                            if split:  # right after a frame's launch: the lock taken between frames
                                frame.clear()
                                frame.wait(1.0)
                            t2 = time.perf_counter()
                            built = check(d.cuGraphInstantiate(graph, 0))
                            t3 = time.perf_counter()
                            try:
                                check(d.cuGraphUpload(built, stream))
                                t4 = time.perf_counter()  # (the executable's destroy is no phase)
                            finally:
                                check(d.cuGraphExecDestroy(built))
                            instantiate, upload = instantiate + t3 - t2, upload + t4 - t3
                    finally:
                        for graph in graphs:
                            check(d.cuGraphDestroy(graph))
                    for name, ms in (("add", t1 - t0), ("instantiate", instantiate), ("upload", upload)):
                        phases[name].append(ms * 1e3)
                    time.sleep(pause_s)
            except BaseException as exc:  # raised again on the calling thread, after the join
                failed.append(exc)
            finally:
                done.set()  # always: the launch loop below ends on it

        launch, period = d.cuGraphLaunch, 1.0 / fps
        worst, frames = 0.0, 0
        check(launch(exec_, stream))
        engine.synchronize()
        builder = threading.Thread(target=build, name="bare-build", daemon=True)
        builder.start()
        try:
            while not done.is_set():
                t = time.perf_counter_ns()
                (err,) = launch(exec_, stream)
                dt = time.perf_counter_ns() - t
                frame.set()
                check((err,))
                worst, frames = max(worst, dt / 1e3), frames + 1
                time.sleep(max(0.0, period - dt / 1e9))
        finally:
            stop.set()
            builder.join()
            engine.synchronize()
    if failed:
        raise failed[0]
    return worst, frames, {name: statistics.median(v) for name, v in phases.items() if v}


def bare_split_launch_us(engine: Any, split: int, calls: int = 400) -> tuple[float, float, int]:
    """What splitting a patch into several executables costs a quiet frame: the running graph's kernel
    nodes built as graphs of at most ``split`` nodes (``bare_build_beside_launches``' split), each
    instantiated, and one ``cuGraphLaunch`` of each timed as a frame, beside the engine's one
    executable launched alone (medians of the same run, taken in turn).

    Returns:
        ``(launches of the split executables µs, launch of the one executable µs, executables)``.
    """
    with engine._graph_lock:
        exec_, stream = _quiet_executable(engine)
        graphs: list[Any] = []
        execs: list[Any] = []
        try:
            for part in _split(kernel_nodes(engine), split):
                graphs.append(_chained_graph(part))
                execs.append(check(d.cuGraphInstantiate(graphs[-1], 0)))
                check(d.cuGraphUpload(execs[-1], stream))
            launch = d.cuGraphLaunch

            def split_frame() -> None:
                for ex in execs:
                    launch(ex, stream)

            for ex in execs:  # the call shapes, checked once; the timed calls unchecked
                check(launch(ex, stream))
            engine.synchronize()
            medians = _alternate_medians(
                {"one": lambda: launch(exec_, stream), "split": split_frame}, calls, engine.synchronize
            )
        finally:
            engine.synchronize()
            for ex in execs:
                check(d.cuGraphExecDestroy(ex))
            for graph in graphs:
                check(d.cuGraphDestroy(graph))
    return medians["split"], medians["one"], len(execs)
