"""Find the block whose kernel faults, in a child process.

CUDA keeps a sticky fault (illegal address and the like) for the rest of the process: the driver
refuses every later call, a primary-context reset included (measured on H100 + driver 580 with
``benchmarks/probes/probe_reset.py``: ``cuDevicePrimaryCtxRetain`` after the reset and a new ``cuCtxCreate``
both return CUDA_ERROR_ILLEGAL_ADDRESS; CUDA documents that the process must be relaunched). So the engine
cannot replay the patch in its own process. It pickles the patch snapshot (pure data: descriptions,
kernel sources, parameter values, links; external inputs become zero-filled buffers of the same
size) and runs ``python -m cudapatch.engine.replay``, which compiles (cubin cache hits; the engine's own
kernels too: a loop's set-condition kernels, the publish kernel, ``engine_kernel_sources``), realizes the
plan unfused (every block its own nodes, so a fault inside a fused kernel is pinned on the member that
makes it) on a fresh context and launches it node by node with a synchronize after each block
(``replay_by_block``, also what ``Engine(debug_launch=True)`` runs every frame). It prints the first
faulting block's id as JSON. Faults that depend on the external data cannot reproduce.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import selectors
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from .._reaper import reap_in_background
from ..errors import CudaLaunchError
from ..kernels._child_pipe import parent_sys_path
from ..kernels._driver import check, driver, error_from_code
from .plan import GraphPlan, MemsetNodePlan, WorkNode

__all__ = [
    "ReplayStandby",
    "attribute_in_child",
    "engine_kernel_sources",
    "main",
    "replay_by_block",
    "replay_environment",
    "replay_plan",
    "replayed_nodes",
]

TIMEOUT_S = 120.0


def replay_by_block(
    plan: GraphPlan, nodes: Sequence[Any], buffers: Sequence[Any], counters_ptr: int, stream: Any
) -> int | None:
    """Launch a realized plan node by node on ``stream``, synchronizing after each block's work: the
    id of the first block whose work faults, or None.

    Args:
        plan: The plan the graph was realized from.
        nodes: The graph's runtime node of each plan node: anything with ``launch_alone(stream)``
            returning the driver's error code (kernel nodes, captured calls), or None (timestamp and
            publish nodes: profiling, not the patch's work, so not replayed).
        buffers: The graph's buffers, by plan buffer index (memset nodes zero them).
        counters_ptr: Device address of the append counters (memset nodes zero them).
        stream: Where to launch.

    Raises:
        CudaError: a failure that is not a kernel fault.
    """
    d = driver()
    plan_nodes = plan.nodes
    regions = plan.regions
    order = replayed_nodes(plan)
    for pos, i in enumerate(order):
        node = plan_nodes[i]
        if isinstance(node, MemsetNodePlan):
            if node.buffer is not None:
                buf = buffers[node.buffer]
                check(d.cuMemsetD8Async(buf.ptr, 0, buf.nbytes, stream), "cuMemsetD8Async")
            else:
                check(d.cuMemsetD32Async(counters_ptr, 0, node.count, stream), "cuMemsetD32Async")
            continue
        n = nodes[i]
        if n is None:
            continue
        if regions and node.block_id in regions:  # type: ignore[union-attr]
            continue  # a region's set-condition kernel: only meaningful inside its graph (bodies run once here)
        err = n.launch_alone(stream)
        after = plan_nodes[order[pos + 1]] if pos + 1 < len(order) else None
        last_of_block = after is None or getattr(after, "block_id", None) != node.block_id  # type: ignore[union-attr]
        if err or last_of_block:
            err = err or d.cuStreamSynchronize(stream)[0]
            if err:
                e = error_from_code(err, "replay")
                if isinstance(e, CudaLaunchError):
                    return node.block_id  # type: ignore[union-attr]
                raise e
    return None


def replayed_nodes(plan: GraphPlan) -> list[int]:
    """The plan nodes a replay launches, in order: every node, except that a body's work runs once:
    the copies of a block's kernel that an unrolled loop makes (``Unroll``), after the first, are
    left out."""
    scopes = plan.scopes
    seen: set[tuple[int, int]] = set()
    out = []
    for i, n in enumerate(plan.nodes):
        if scopes and i in scopes and isinstance(n, WorkNode):
            key = (n.block_id, n.kernel)
            if key in seen:
                continue
            seen.add(key)
        out.append(i)
    return out


def _portable(snap: Any) -> Any:
    """The snapshot with external bindings reduced to their size and type (pointers die with us)."""
    from .context import ExternalBinding

    bindings = {k: ExternalBinding(0, b.count, b.dtype) for k, b in snap.bindings.items()}
    return dataclasses.replace(snap, bindings=bindings)


def replay_environment(device: int) -> dict[str, str]:
    """The replay process's environment: this one's, no compiler processes of its own, the device to
    warm up on, and ``PYTHONPATH`` led by this process's ``sys.path`` entries that exist (then what
    ``PYTHONPATH`` held), so it imports cudapatch, and the modules of Numba kernels, from where this
    process did: also where they are found only through ``sys.path`` (an embedded host's, a
    ``sys.path.insert``, a checkout run from its root).
    """
    paths = [p for p in dict.fromkeys(parent_sys_path()) if os.path.exists(p)]
    before = os.environ.get("PYTHONPATH", "")
    return dict(
        os.environ,
        CUDAPATCH_COMPILE_PROCESSES="0",
        CUDAPATCH_REPLAY_DEVICE=str(device),
        PYTHONPATH=os.pathsep.join(paths + ([before] if before else [])),
    )


class ReplayStandby:
    """A replay process: it imports the engine and makes its CUDA context, then waits for the patch on
    stdin. Started before it is needed (``Engine.prepare_fault_replay``; the isolated engine's child
    starts its process first thing, in ``BOOTSTRAP``, and hands it over), naming a faulting block skips
    the interpreter start, the imports and the context (most of the second a fresh replay process
    takes, measured on the H200 host); ``attribute_in_child`` starts one at the fault otherwise. One
    use; ``close`` ends it unused.

    Args:
        device: The device it makes its context on.
        proc: The process, if started already (``python -m cudapatch.engine.replay`` with pipes for
            its stdin, stdout and stderr and ``replay_environment(device)``), else started here.
    """

    def __init__(self, device: int, proc: subprocess.Popen | None = None) -> None:
        self.device = device
        self.proc = proc or subprocess.Popen(
            [sys.executable, "-m", "cudapatch.engine.replay"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=replay_environment(device),
        )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, payload: bytes) -> tuple[bytes, bytes]:
        """Send the request, wait for the answer: (stdout, stderr) so far. The answer is the line that
        starts ``{"culprit"``; once it came, the process's exit (the driver's teardown of the context
        the replay faulted) is waited for in the background (``_reaper``), not here. Without an
        answer, everything it wrote until it ended. The request is written as the process reads it
        (a snapshot outgrows a pipe's buffer), under the same deadline as the answer.

        Raises:
            OSError, subprocess.TimeoutExpired: the process failed or took longer than ``TIMEOUT_S``
                (it is killed then).
        """
        deadline = time.monotonic() + TIMEOUT_S
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        out, err = bytearray(), bytearray()
        todo = memoryview(payload)
        reads = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        try:
            with selectors.DefaultSelector() as sel:  # (poll: any descriptor number, unlike select())
                for fd in reads:
                    os.set_blocking(fd, False)
                    sel.register(fd, selectors.EVENT_READ)
                stdin = proc.stdin.fileno()
                os.set_blocking(stdin, False)
                sel.register(stdin, selectors.EVENT_WRITE)
                while reads and not _answered(out):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise subprocess.TimeoutExpired(proc.args, TIMEOUT_S)
                    for key, _ in sel.select(left):
                        fd = key.fd
                        if fd == stdin:
                            try:
                                todo = todo[os.write(fd, todo) :]
                            except BrokenPipeError:  # it ended before it read the request: stderr says why
                                todo = todo[:0]
                            if not todo:
                                sel.unregister(fd)
                                proc.stdin.close()
                            continue
                        chunk = os.read(fd, 1 << 16)
                        if chunk:
                            reads[fd] += chunk
                        else:
                            sel.unregister(fd)
                            del reads[fd]
        except BaseException:
            self.close()
            raise
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if reads:  # answered: it has nothing more to say; its exit is waited for elsewhere
            reap_in_background(proc, timeout=TIMEOUT_S)
        else:  # it ended without an answer
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.close()
                raise
            proc.stdout.close()
            proc.stderr.close()
        return bytes(out), bytes(err)

    def close(self) -> None:
        """End it, unused or stuck (killed), and close its pipes."""
        proc = self.proc
        if proc.poll() is None:
            proc.kill()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        proc.wait()


def _answered(out: bytearray) -> bool:
    """Whether the replay's stdout holds its whole answer line."""
    i = out.find(b'{"culprit"')
    return i >= 0 and (i == 0 or out[i - 1] == 0x0A) and out.find(b"\n", i) >= 0


def attribute_in_child(
    snap: Any,
    *,
    device: int,
    cache_dir: Any,
    standby: ReplayStandby | None = None,
    times: dict[str, float] | None = None,
) -> tuple[int | None, str]:
    """Replay ``snap`` block by block in a child process (``standby`` if it is alive, else a new one).
    ``times`` takes the replay's steps as ``time.monotonic()`` stamps (``replay_read``: the request
    read, ``replay_kernels``: the blocks' kernels loaded, ``replay_built``: the graph realized,
    ``replay_faulted``: the block by block launch done).

    Returns:
        ``(block id or None, what happened)``.
    """
    try:
        payload = pickle.dumps({"snapshot": _portable(snap), "device": device, "cache_dir": cache_dir})
    except Exception as exc:  # a kernel source that cannot travel (a lambda as a Numba kernel, ...)
        if standby is not None:
            standby.close()
        return None, f"the patch cannot be sent to a replay process: {exc}"
    try:
        if standby is None or not standby.alive:
            if standby is not None:
                standby.close()  # it ended before it was needed: a new one takes the request
            standby = ReplayStandby(device)
        stdout, stderr = standby.run(payload)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:  # (run killed it)
        return None, f"the replay process failed: {exc}"
    lines = [x for x in stdout.decode(errors="replace").splitlines() if x.startswith('{"culprit"')]
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return None, f"the replay process failed: {stderr.decode(errors='replace')[-400:]}"
    if times is not None and isinstance(result.get("times"), dict):
        times.update(result["times"])
    return result.get("culprit"), result.get("detail", "")


def replay_plan(snap: Any) -> GraphPlan:
    """The plan a replay realizes: unfused, so every block runs on nodes of its own and a fault is pinned
    on the block, never on a fused group (an engine's plan fuses by default)."""
    from .compiler import compile_plan

    return compile_plan(snap, fuse=False)


def engine_kernel_sources(plan: GraphPlan) -> tuple[dict[tuple[int, int], Any], Any, Any]:
    """The engine's own kernels that ``plan``'s graph holds beside its blocks' kernels, as the engine's
    builds load them (``DeviceResources.region_functions`` and ``readback_functions``), for the replay
    process, which realizes the whole graph: a patch with a loop has set-condition kernels and an
    iteration counter (so a publish node), which ``realize`` refuses to build without their kernels.

    Returns:
        ``({(block id, kernel index): CudaSource}`` of each region's set-condition kernels and each
        FrameDelay copy node's kernel, the timestamp kernel's source or None, the publish kernel's
        source or None).
    """
    from .delay_copy import COPY_ENTRIES, copy_kernel
    from .region_kernels import REGION_ENTRIES, region_kernel
    from .resources import PUBLISH_KERNEL, STAMP_KERNEL

    sources: dict[tuple[int, int], Any] = {}
    if plan.regions:
        regions = {v: k for k, v in REGION_ENTRIES.items()}
        copies = {v: k for k, v in COPY_ENTRIES.items()}
        for n in plan.kernel_nodes:
            in_region = n.block_id in plan.regions
            entry = regions.get(n.kernel) if in_region else copies.get(n.kernel)
            if entry is not None:
                sources[(n.block_id, n.kernel)] = (region_kernel if in_region else copy_kernel)(entry)[0]
    stamp = STAMP_KERNEL if plan.stamp_count else None
    publish = PUBLISH_KERNEL if plan.stamp_count or plan.counters or plan.probes else None
    return sources, stamp, publish


def main() -> None:
    """The child: read the pickled request on stdin, print ``{"culprit": id or null, "detail": ...}``."""
    from ..errors import CudaError
    from ..kernels.builder import KernelBuilder
    from ..kernels.cache import CubinCache
    from ..kernels.module_cache import ModuleCache
    from .buffers import BufferPool, GpuBuffer
    from .context import ExternalBinding
    from .device import DeviceContext
    from .libraries import LibraryHandles
    from .realize import realize

    warm = os.environ.get("CUDAPATCH_REPLAY_DEVICE")
    ready = DeviceContext(int(warm)) if warm is not None else None  # a standby: the context before the request
    data = sys.stdin.buffer.read()
    if not data:  # a standby its engine closed unused
        os._exit(0)
    req = pickle.loads(data)
    times = {"replay_read": time.monotonic()}
    snap = req["snapshot"]
    dev = ready if ready is not None and ready.ordinal == req["device"] else DeviceContext(req["device"])
    pool = BufferPool(dev.make_current)
    modules = ModuleCache(device_key=dev.key)
    builder = KernelBuilder(
        arch=dev.arch,
        cache=CubinCache(req["cache_dir"]),
        modules=modules,
        make_current=lambda: check(driver().cuCtxSetCurrent(dev.context), "cuCtxSetCurrent"),
    )
    keep: list[GpuBuffer] = []
    bindings = {}
    for key, b in snap.bindings.items():
        buf = GpuBuffer(pool, b.dtype, b.count, stream=dev.stream)
        buf.fill_bytes(0)
        keep.append(buf)
        bindings[key] = ExternalBinding(buf.ptr, b.count, b.dtype, owner=buf)
    snap = dataclasses.replace(snap, bindings=bindings, probes=())  # probes read, never fault: left out
    try:
        functions = {}
        for b in snap.blocks:
            for ki, spec in enumerate(b.description.kernels):
                if spec.source is not None:  # captured library calls are captured again by realize
                    functions[(b.id, ki)] = builder.build(spec.source).function
        times["replay_kernels"] = time.monotonic()
        plan = replay_plan(snap)
        own, stamp, publish = engine_kernel_sources(plan)
        functions.update({key: builder.build(source).function for key, source in own.items()})
        graph = realize(
            plan, device=dev, pool=pool, functions=functions, bindings=snap.bindings,
            block_names=snap.names, libraries=LibraryHandles(dev, pool),
            stamp_function=builder.build(stamp).function if stamp is not None else None,
            publish_function=builder.build(publish).function if publish is not None else None,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001  (said to the engine, which names no block then)
        print(json.dumps({"culprit": None, "detail": f"the replay could not build the patch: {exc}"}), flush=True)
        os._exit(0)
    times["replay_built"] = time.monotonic()
    try:
        culprit = graph.replay(dev.stream)
        detail = "faulted" if culprit is not None else "no fault when replayed"
    except CudaError as exc:
        culprit, detail = None, f"replay failed: {exc}"
    times["replay_faulted"] = time.monotonic()
    print(json.dumps({"culprit": culprit, "detail": detail, "times": times}), flush=True)
    os._exit(0)  # a faulted context cannot be torn down cleanly; the process ends here


if __name__ == "__main__":
    main()
