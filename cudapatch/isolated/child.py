"""The engine process of an isolated engine: a real ``Engine`` driven by the host's messages.

Started by ``IsolatedEngine`` as a program of its own (``python -c BOOTSTRAP``, which sets
``sys.path`` from the host and calls ``main``), never through ``multiprocessing``, so the user's
``__main__`` never runs here (as for the compiler child, ``kernels/_compiler_child.py``, whose
frames this speaks). Messages are in ``protocol.py``; edits are applied by ``mirror.ChildPatch``.

Each frame: the host's Hot values, a stream wait on the host's event (outputs the host still reads
are not overwritten), ``Engine.update()``, then the frame number written into the shared frame word
on the engine's stream (the host's stream waits for it). When the output buffers (a new graph, or a
Warm patch that moved or resized one) or the diagnostics changed, they go back to the host. When the
engine is lost (CUDA refuses this process after a GPU fault; its recovery has named the faulting
block by replay), the child reports the blocks to disable and exits with ``EXIT_FAULT``; the host
starts another child.
"""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import time
from typing import Any

from ..kernels._compiler_child import MAX_FRAME, encode_frame
from .protocol import EXIT_FAULT, PROTOCOL, OutputHandle, StartConfig, diag_record

# How long the child waits for a message before it asks its stream whether a frame faulted.
IDLE_CHECK_S = 0.05

__all__ = ["BOOTSTRAP", "main"]

#: The ``-c`` program that starts the child (``sys.path`` from the host first, then serve).
BOOTSTRAP = """\
import faulthandler, json, os, sys
faulthandler.enable()
_paths = json.loads(os.environ.pop("CUDAPATCH_ISOLATED_PATH", "[]"))
sys.path[:] = _paths + [p for p in sys.path if p not in _paths]
del _paths
_replay = None
if "CUDAPATCH_ISOLATED_REPLAY" in os.environ:  # first: it imports and makes its context while we do
    import subprocess
    _env = {k: v for k, v in os.environ.items() if not k.startswith("CUDAPATCH_ISOLATED_")}
    try:
        _replay = subprocess.Popen(
            [sys.executable, "-m", "cudapatch.engine.replay"], stdin=-1, stdout=-1, stderr=-1,
            env=dict(_env, **json.loads(os.environ.pop("CUDAPATCH_ISOLATED_REPLAY"))),
        )
    except OSError:  # the engine starts one when it needs it
        pass
    del _env
from cudapatch.isolated.child import main
sys.exit(main(_replay))
"""

_HEADER = 8


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_message(fd: int) -> Any:
    header = _read_exact(fd, _HEADER)
    if header is None:
        return None
    n = int.from_bytes(header, "big")
    if n > MAX_FRAME:
        raise ValueError(f"a message of {n} bytes: the stream is corrupt")
    payload = _read_exact(fd, n)
    return None if payload is None else pickle.loads(payload)


class _Server:
    """The child's state: the engine, the mirrored patch, and what the host was last told."""

    #: What the host was last sent of the output buffers (``_output_memory``); None before any graph.
    _outputs_sent: dict[tuple[int, str], tuple] | None = None

    def __init__(self, cfg: StartConfig, out_fd: int, replay: Any = None) -> None:
        from ..engine.engine import Engine
        from .ipc import FrameWord, IpcImports
        from .mirror import ChildPatch

        self._out = out_fd
        self.engine = engine = Engine(
            cfg.device,
            name=cfg.name,
            cache_dir=cfg.cache_dir,
            wait_for_compile=cfg.wait_for_compile,
            watch_files=cfg.watch_files,
            fuse=cfg.fuse,  # the host keeps what it reads (``SetKept``): kept outputs are never fused away
            reuse_buffers=False,  # the host maps every output through IPC: none may be overwritten by another
            background_builds=cfg.background_builds,
            debug_launch=cfg.debug_launch,
            freeze_collector=cfg.freeze_collector,
        )
        # A fault is named without starting an interpreter then (the replay process ``BOOTSTRAP``
        # started), and not reset: this process is replaced after a fault.
        engine.prepare_fault_replay(replay, reset=False)
        self.word = FrameWord.attach(cfg.frame_word_fd) if cfg.frame_word_fd >= 0 else None
        self.imports = IpcImports()

        self.shared: dict[int, Any] = {}  # serial -> SharedPages of the host mapped here (Upload/Download rings)
        self.patch = ChildPatch(engine, self.import_input)
        self._graph: Any = None
        self._plan: Any = None  # the running graph's plan the host was last told of (a Warm patch replaces it)
        self._diags: Any = None
        self._states: dict[int, tuple[str, str]] | None = None  # what the host was last told of the blocks' states
        self._busy = False  # what the host was last told of ``building``
        self._shown: dict[int, Any] = {}  # what the host was last told of each block's sizes, shapes, group
        self.last_frame = cfg.start_frame  # the newest frame message run

    def import_input(self, h: Any) -> Any:
        """What ``engine.bind`` takes for an ``InputHandle`` of the host."""
        from ..engine.bindings import DeviceArray
        from .ipc import SharedPages

        if h.array is not None:
            return h.array  # a host array: the engine copies it into a buffer of its own
        if h.shared:  # pinned pages of the host's ring: mapped here too, written and read in place
            serial, path, nbytes, offset = h.shared
            pages = self.shared.get(serial)
            if pages is None:
                self.engine.device.make_current()
                pages = self.shared[serial] = SharedPages.attach(path, nbytes)
            return DeviceArray(pages.device_ptr + offset, h.count, h.dtype, shape=h.shape)
        return DeviceArray(self.imports.pointer(h.handle, h.offset), h.count, h.dtype, shape=h.shape)

    def send(self, message: Any) -> None:
        data = memoryview(encode_frame(message))
        while data:
            data = data[os.write(self._out, data) :]

    # -- frames -------------------------------------------------------------------------------------
    def frame(self, n: int, hot: tuple) -> None:
        from .ipc import HOST_READY

        e = self.engine
        self.last_frame = n
        if hot:
            self.patch.hot(hot)
        stream = e.device.stream
        if self.word is not None and e.lost is None:  # outputs the host still reads stay until it says so
            e.device.make_current()
            self.word.wait(stream, n, HOST_READY)
        e.update()
        if self.word is not None and e.lost is None:
            self.word.signal(e.device.stream, n)

    def tell(self, *, edited: bool = False) -> None:
        """Send what changed since the host was last told: output buffers and what the blocks show of
        them, whether a build is pending (always after ``edited``: the host assumed one), diagnostics
        and the blocks' states.

        A build (Cold or Warm: a new plan) sets the blocks' states even when no diagnostic changed
        (NotCompiled before it, OK after): the states and sizes are compared then, and the states after
        edits or new diagnostics too; never in a frame that changed nothing (no loop over the blocks).
        Output buffers go again with a new graph, and after a Warm patch that moved, grew or reshaped
        any of them (``outputs_changed``)."""
        from .ipc import export_device_memory

        e = self.engine
        g = e.graph
        plan = g.plan if g is not None else None
        replaced = g is not self._graph
        built = (replaced or plan is not self._plan) and e.lost is None
        if built:
            # A Warm patch keeps the graph but may move or resize outputs (a buffer grown from the pool):
            # the host maps what the graph uses now, so the handles go again whenever they changed.
            now = _output_memory(g, self.patch.all_blocks()) if g is not None else {}
            if outputs_changed(replaced, self._outputs_sent, now):
                self._graph, self._outputs_sent = g, now
                outputs = {}
                for key, (ptr, count, dtype, nbytes, shape, other) in now.items():
                    handle, offset = export_device_memory(ptr)
                    alt = export_device_memory(other) if other is not None else ()
                    outputs[key] = OutputHandle(handle, offset, count, dtype, nbytes, shape, alt, self.last_frame)
                self.send(("outputs", outputs, replaced))
            self._plan = plan  # a Warm patch keeps the graph: sizes may change with its plan
            shown = {hid: (b.debug.sizes, b.debug.shapes, b.debug.fused) for hid, b in self.patch.all_blocks().items()}
            changed = {hid: v for hid, v in shown.items() if self._shown.get(hid) != v}  # an edit touches few
            self._shown = shown
            if changed:
                self.send(("built", changed))
        busy = e.lost is None and (e.building or e.context.dirty.structure)
        if busy != self._busy or edited:
            self._busy = busy
            self.send(("building", busy))
        diags = e.diagnostics()
        if diags != self._diags or built or edited:
            states = self._states_now()
            if diags != self._diags or states != self._states:
                self._diags, self._states = diags, states
                self.send(("diagnostics", self._records(diags), states))

    def _records(self, diags: Any) -> tuple:
        to_host = self.patch.to_host
        return tuple(diag_record(d, to_host) for d in diags)

    def _states_now(self) -> dict[int, tuple[str, str]]:
        """Host id -> (state, message) of every block here, composites and their inner blocks."""
        return {hid: (b.debug.state.value, b.debug.message) for hid, b in self.patch.all_blocks().items()}

    def check_idle(self) -> None:
        """Between messages: a fault in a frame already launched shows only at the next driver call,
        and a host that drops frames while we lag sends none. Ask the stream, so the fault is found
        (and reported by ``lost()``) without waiting for a frame that never comes.

        Raises:
            CudaLaunchError: the stream met a sticky fault (the caller hands it to the engine).
        """
        from ..kernels._driver import check, driver

        e = self.engine
        if e.lost is not None:
            return
        d = driver()
        (err,) = d.cuStreamQuery(e.device.stream)
        if err not in (d.CUresult.CUDA_SUCCESS, d.CUresult.CUDA_ERROR_NOT_READY):
            check((err,), "cuStreamQuery")

    def lost(self) -> bool:
        """When the engine is lost: report the faulting blocks and say so (the caller exits)."""
        e = self.engine
        if e.lost is None:
            return False
        records = self._records(e.diagnostics())
        disabled = {r[1]: r[3] for r in records if r[2] == "gpu-fault" and r[1] is not None}
        self.send(("fault", records, disabled, dict(e.fault_times, sent=time.monotonic())))
        return True

    # -- requests -----------------------------------------------------------------------------------
    def request(self, what: str, args: tuple) -> Any:
        e = self.engine
        if what == "wait_ready":
            e.wait_ready(*args)
            return None
        if what == "read":
            hid, port = args
            return e.read(self.patch.all_blocks()[hid], port)
        if what in ("stats", "show_frame"):
            import dataclasses

            show = what == "show_frame"
            stats = e.show_frame() if show else e.stats()
            to_host = self.patch.to_host
            blocks = tuple(dataclasses.replace(b, block_id=to_host.get(b.block_id, -1)) for b in stats.blocks)
            diags = tuple(diag_record(d, to_host) for d in stats.diagnostics)
            # Each loop's "Iterations: n/limit" of the same frame, which ``show_frame()`` put in its tooltip.
            loops = (
                {
                    hid: b.debug.append_fill["Iterations"]
                    for hid, b in self.patch.blocks.items()
                    if "Iterations" in b.debug.append_fill
                }
                if show
                else {}
            )
            times = {to_host[k]: ms for k, ms in stats.block_ms.items() if k in to_host}  # inner blocks too
            return dataclasses.replace(stats, blocks=blocks, diagnostics=diags, block_ms=times), loops
        if what == "iterations":
            (hid,) = args
            b = self.patch.blocks.get(hid)
            return None if b is None else e.iterations(b)
        if what == "synchronize":
            e.synchronize()
            return None
        if what == "counters":
            return e.counters
        raise ValueError(f"unknown request {what!r}")


def _output_memory(g: Any, blocks: dict[int, Any]) -> dict[tuple[int, str], tuple]:
    """(host block id, port) -> ``(ptr, count, dtype, nbytes, shape, other ptr or None)`` of every output
    the running graph holds in a buffer: what the host maps (no driver call; a build's work, never a
    frame's)."""
    shapes = g.plan.shapes
    out: dict[tuple[int, str], tuple] = {}
    for hid, b in blocks.items():
        for port in b.description.outputs:
            buf = g.output(b.id, port.name)
            if buf is not None:
                other = _other_of_pair(g, b.id, port.name, buf)
                out[(hid, port.name)] = (
                    buf.ptr, buf.count, buf.dtype, buf.nbytes, shapes.get((b.id, port.name)),
                    other.ptr if other is not None else None,
                )  # fmt: skip
    return out


def outputs_changed(replaced: bool, sent: dict | None, now: dict) -> bool:
    """Whether the output handles go to the host after a build: always with a new graph (the host
    drops every mapping of the old one), else (a Warm patch into the running graph) when any output's
    memory, count or shape differs from what the host was sent."""
    return replaced or sent != now


def _other_of_pair(g: Any, block_id: int, port: str, buf: Any) -> Any:
    """For an output held in a FrameDelay's pair of buffers, which swap every frame in a graph that
    alternates two executables (``engine/phases.py``): the pair's other buffer (``buf`` is the one the
    frame launched last wrote). None for any other output."""
    plan = g.plan
    bi = plan.outputs.get((block_id, port))
    swaps = plan.swaps
    if bi is None or bi not in swaps or (block_id, port) in g.bypass.outputs:
        return None
    a, b = g.buffers[bi], g.buffers[swaps[bi]]
    if a.ptr == b.ptr:
        return None
    return b if buf.ptr == a.ptr else a


def _detach_stdio() -> tuple[int, int]:
    """The protocol on duplicated descriptors; stray prints go to stderr (as the compiler child does)."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return proto_in, proto_out


_WARM: list[Any] = []


def _warm_up(device: str | None) -> None:
    """Before ``start`` arrives: import the engine and make the device's context, so that a child
    kept in reserve starts serving at once (a failure here is met again, and reported, at start)."""
    try:
        from ..engine.engine import Engine  # noqa: F401  (the import is the work)

        if device is not None:
            from ..engine.device import DeviceContext

            # Held for the process's life: the engine retains the same primary context again, at no cost.
            _WARM.append(DeviceContext(int(device)))
    except Exception:  # noqa: BLE001  (no driver, no device: the engine says so properly at start)
        pass


def main(replay: subprocess.Popen | None = None) -> int:
    """Serve the host until it closes our stdin or says ``close``; the exit status.

    Args:
        replay: The fault replay process ``BOOTSTRAP`` started before it imported cudapatch (so that
            a fault soon after the start finds it ready), handed to the engine.
    """
    import faulthandler
    import signal

    from .._reaper import wait_for_all
    from ..errors import CudaError, CudaLaunchError

    proto_in, proto_out = _detach_stdio()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the host decides when the child ends
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: where a stuck child is
    device = os.environ.pop("CUDAPATCH_ISOLATED_DEVICE", None)
    _warm_up(device)
    first = _read_message(proto_in)
    standby = None
    if replay is not None:
        from ..engine.replay import ReplayStandby

        standby = ReplayStandby(int(device) if device is not None else -1, replay)
    if first is None or first[0] != "start":
        if standby is not None:
            standby.close()
        return 2
    try:
        server = _Server(first[1], proto_out, standby)
    except BaseException:
        if standby is not None:
            standby.close()
        raise
    server.send(("ready", PROTOCOL, os.getpid()))
    while True:
        if not select.select([proto_in], [], [], IDLE_CHECK_S)[0]:
            msg: Any = ("idle",)
        else:
            msg = _read_message(proto_in)
        if msg is None or msg[0] == "close":
            try:
                server.engine.close()
                wait_for_all(10.0)
            finally:
                os._exit(0)  # no interpreter teardown: nothing of it would run on the GPU any more
        kind = msg[0]
        edited = False
        try:
            if kind == "idle":
                server.check_idle()
            elif kind == "frame":
                server.frame(msg[1], msg[2])
            elif kind == "edits":
                edited = True
                server.patch.apply(msg[1])
            elif kind == "request":
                _, rid, what, args = msg
                try:
                    value = server.request(what, args)
                except CudaLaunchError:
                    raise
                except Exception as exc:  # the host re-raises it in its thread
                    server.send(("reply", rid, False, exc))
                else:
                    server.tell()  # outputs and diagnostics first: after wait_ready() the host has them
                    server.send(("reply", rid, True, value))
        except CudaLaunchError as exc:  # a fault met outside update(): the engine finds the block
            server.engine.report_fault(exc)
        except CudaError as exc:
            print(f"cudapatch isolated engine: {exc}", file=sys.stderr)
        except Exception:  # an edit the host validated but this engine refused: say why, keep serving
            import traceback

            traceback.print_exc()
        if server.lost():
            # The host maps our output buffers: it lets its stream past our unfinished frame, waits
            # for it, unmaps them and closes our stdin. Only then do we go (with us, our memory).
            sys.stderr.flush()
            while _read_message(proto_in) is not None:
                pass
            wait_for_all(10.0)  # the replay's exit (the host no longer waits for ours)
            os._exit(EXIT_FAULT)  # CUDA refuses this process; no teardown can run
        server.tell(edited=edited)


if __name__ == "__main__":
    sys.exit(main())
