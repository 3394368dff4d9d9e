"""Block states through the isolated engine, on the CPU: the host's ``IsolatedEngine`` talks to the real
child server (``child._Server`` and ``mirror.ChildPatch``) over an engine with the real ``DiagnosticBoard``
and graph compiler (no device), and every block's state and message, the ``stats()`` rows and
``diagnostics(composite)`` equal those of the same patch on that engine in process: composites
(flattened and child graph, in a For's body), their inner blocks, OK, Warning, Error and NotCompiled,
across builds that change none of the diagnostics."""

from __future__ import annotations

import logging
import pickle
from types import SimpleNamespace

import pytest

from cudapatch import Composite, Engine, Fill, For, Scale
from cudapatch.engine import compile_plan
from cudapatch.engine.board import DiagnosticBoard
from cudapatch.engine.faults import FaultState
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.engine.stats import collect_stats
from cudapatch.errors import GraphCompileError
from cudapatch.isolated import RestartPolicy
from cudapatch.isolated.child import _Server
from cudapatch.isolated.mirror import ChildPatch

from .plan_engine import PlanOnlyEngine
from .test_isolated import FakeHostSide

WHY = "CUDA_ERROR_ILLEGAL_ADDRESS in block 'pair/a' (kernel scale): the block is disabled"


def bare_server(engine, patch, send, last_frame: int = 0) -> _Server:
    """The engine process's server without its process: ``engine`` and ``patch`` given, messages to
    ``send``, and what the host was last told as ``_Server.__init__`` starts it (nothing yet)."""
    server = _Server.__new__(_Server)
    server.engine, server.patch, server.send = engine, patch, send
    server._graph, server._plan, server._diags, server._states = None, None, None, None
    server._busy, server._shown, server.last_frame = False, {}, last_frame
    return server


class _NoKernels:
    diag_version = 0

    def diagnostics(self):
        return ()


class BoardEngine(PlanOnlyEngine):
    """What the states come from in an ``Engine``, with no device: each ``update()`` plans the patch (the
    disabled blocks left out) and hands the plan's diagnostics and running blocks to a real
    ``DiagnosticBoard`` (``build_done``, or ``build_failed``), which sets the blocks' states; ``stats()``
    is ``collect_stats`` of a frame with no GPU numbers. The running graph is the plan with no buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.faults = FaultState()
        self.board = DiagnosticBoard(
            self.context.registry, kernels=_NoKernels(), faults=self.faults, logger=logging.getLogger("test.board")
        )
        self.graph = None
        self.lost = None
        self.fault_times: dict = {}
        self.building = False
        self.device = SimpleNamespace(stream=0)

    def disable(self, block, reason):
        self.faults.disable(block.id, reason)
        self.context.dirty.mark_structure()

    def set_profiling(self, level):
        super().set_profiling(level)
        self.context.dirty.mark_structure()

    def bind(self, block, port, array, *, dtype=None):
        raise AssertionError("no bindings in these patches")

    def update(self):
        self.updates += 1
        if not self.context.dirty.structure:
            return  # nothing to build: the graph launches as it is
        self.context.dirty.clear_structure()
        snap = self.context.snapshot()
        try:
            plan = compile_plan(snap, None, self.profiling, self.faults.disabled, reuse=False)
        except GraphCompileError as exc:
            self.board.build_failed(exc.diagnostics)
            return
        self.plan = plan
        if self.graph is None:
            self.graph = SimpleNamespace(plan=plan, output=lambda block_id, port: None)
        else:  # later builds patch the graph in place, as a Warm one does: only its plan is new
            self.graph.plan = plan
        self.board.build_done(plan.diagnostics, plan.block_order)

    def diagnostics(self, block=None):
        return self.board.current if block is None else self.board.of_block(block.id)

    def stats(self):
        return collect_stats(
            level=self.profiling,
            blocks=self.context.registry,
            graph=None,
            reading=SimpleNamespace(frame=None, stamps=None, age=None),
            pool=SimpleNamespace(in_use_bytes=0, total_allocated_bytes=0),
            diagnostics=self.board.current,
        )


class ServedChild:
    """A child process in this one: each message goes through the real ``_Server`` (edits, frames,
    requests, then ``tell``, as ``child.main`` does), and what it sends comes back pickled, as through
    the pipe."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.inbox: list = []
        self.eof = False
        self.closed = False
        engine = BoardEngine()
        send = lambda m: self.inbox.append(pickle.loads(pickle.dumps(m)))  # noqa: E731
        server = self.server = bare_server(engine, ChildPatch(engine, lambda h: h), send, cfg.start_frame)
        server.word = None

    def send(self, message):
        message = pickle.loads(pickle.dumps(message))
        kind, server, edited = message[0], self.server, False
        if kind == "frame":
            server.frame(message[1], message[2])
        elif kind == "edits":
            edited = True
            server.patch.apply(message[1])
        elif kind == "request":
            _, rid, what, args = message
            value = server.request(what, args)
            server.tell()
            server.send(("reply", rid, True, value))
        elif kind == "close":
            self.closed = True
            return
        server.tell(edited=edited)

    def read(self):
        out, self.inbox = self.inbox, []
        return out

    def wait_readable(self, timeout):
        pass

    def stderr_text(self):
        return ""

    def close(self, timeout=5.0):
        self.closed = True
        return "exited with code 0"

    def release(self):
        self.closed = True


class Pair(Composite):
    type_name = "Pair"

    def compose(self, c) -> None:
        c.add("a", Scale(Factor=2.0))
        c.add("b", Scale(Offset=0.5))
        c.link("a.Out", "b.In")
        c.expose("In", "a.In")
        c.expose("Out", "b.Out")
        c.expose("Gain", "a.Factor", "b.Factor")


def _patch(e, child_graph):
    """The GPU test's patch (tests/gpu/test_isolated_regions_gpu.py), fed by a Fill instead of a binding."""
    src = e.add(Fill(name="src", Count=1024, Value=1.0))
    pair = e.add(Pair(name="pair", Gain=1.5, child_graph=child_graph))
    loop = e.add(For(name="Loop", Count=3))
    inner = e.add(Pair(name="inner", Gain=0.5), region=loop)
    tail = e.add(Scale(name="tail"))
    e.connect(src, "Out", pair, "In")
    e.connect(pair, "Out", inner, "In")
    e.connect(inner, "Out", tail, "In")
    e.set_profiling("PerBlock")
    return {b.name: b for b in (src, pair, loop, inner, tail)}


def _shown(e, blocks):
    """Every block's state and message, the inner blocks of composites by qualified name."""
    out = {}
    for name, b in blocks.items():
        out[name] = (b.debug.state.value, b.debug.message)
        if isinstance(b, Composite):
            for inner_name, inner in b.inner_blocks():
                out[f"{name}/{inner_name}"] = (inner.debug.state.value, inner.debug.message)
    return out


def _rows(e, blocks):
    names = {b.id: name for name, b in blocks.items()}
    return [(names.get(r.block_id), r.state, r.message) for r in e.stats().blocks]


def _diags(e, blocks):
    return {name: [(d.severity, d.code, d.message) for d in e.diagnostics(b)] for name, b in blocks.items()}


@pytest.fixture
def iso():
    e = Engine(isolated=True, host_side=FakeHostSide(), launch=ServedChild, policy=RestartPolicy(max_restarts=3))
    yield e
    e.close()


def _both(iso, child_graph):
    normal = BoardEngine()
    return (normal, _patch(normal, child_graph)), (iso, _patch(iso, child_graph))


def _same(pairs):
    (normal, nb), (iso, ib) = pairs
    iso.synchronize()  # reads what the child sent after the frame
    assert _shown(iso, ib) == _shown(normal, nb)
    assert _rows(iso, ib) == _rows(normal, nb)
    assert _shown(iso, ib) == _shown(normal, nb)  # stats() puts only times on the blocks
    assert _diags(iso, ib) == _diags(normal, nb)
    return _shown(iso, ib)


@pytest.mark.parametrize("child_graph", [False, True], ids=["flattened", "child-graph"])
def test_states_of_composites_and_their_inner_blocks_are_the_in_process_ones(iso, child_graph):
    pairs = _both(iso, child_graph)
    (normal, nb), _ = pairs
    assert set(_shown(iso, pairs[1][1]).values()) == {("NotCompiled", "")}  # nothing built yet
    for _ in range(2):  # a build changes no diagnostic here: the states come over all the same
        for e in (normal, iso):
            e.set_profiling("None" if e.profiling is ProfilingLevel.PER_BLOCK else "PerBlock")  # builds again
            e.update()
        shown = _same(pairs)
    assert {shown[n][0] for n in ("src", "pair", "Loop", "inner", "tail")} == {"OK"}
    assert shown["pair/a"] == ("NotCompiled", "")  # as in process: the board writes registered blocks only


@pytest.mark.parametrize("child_graph", [False, True], ids=["flattened", "child-graph"])
def test_a_warning_an_error_and_a_block_left_out_show_as_in_process(iso, child_graph):
    pairs = _both(iso, child_graph)
    (normal, nb), (_, ib) = pairs
    normal.update()
    iso.update()
    _same(pairs)
    for e, b in ((normal, nb), (iso, ib)):  # the composite's input unlinked: it and what follows it are left out
        e.disconnect(b["src"], "Out", b["pair"], "In")
        e.update()
    shown = _same(pairs)
    assert shown["pair"][0] == "NotCompiled" and shown["pair"][1] and shown["src"][0] == "OK"
    for e, b in ((normal, nb), (iso, ib)):  # linked again: everything runs
        e.connect(b["src"], "Out", b["pair"], "In")
        e.update()
    assert {s for s, _ in _same(pairs).values()} == {"OK", "NotCompiled"}
    normal.disable(nb["pair"].inner("a"), WHY)  # a fault in an inner block: the error shows on the composite
    iso.disable(ib["pair"].inner("a"), WHY)
    normal.update()
    iso.update()
    shown = _same(pairs)
    assert shown["pair"] == ("Error", WHY) and ("error", "gpu-fault", WHY) in _diags(iso, ib)["pair"]
    iso.update()  # another frame, nothing new: the states stay
    _same(pairs)


def test_the_states_go_over_only_when_a_build_or_the_diagnostics_changed(iso):
    blocks = _patch(iso, False)
    iso.update()
    child = iso._child
    told = []
    send = child.server.send
    child.server.send = lambda m: (told.append(m[0]), send(m))
    for _ in range(3):
        iso.update()  # frames with nothing dirty: nothing changed, the child tells nothing
    assert told == [] and blocks["pair"].debug.state.value == "OK"
    blocks["tail"].set("Offset", 1.0)  # Hot: no build, nothing told
    iso.update()
    assert told == []


@pytest.mark.parametrize("child_graph", [False, True], ids=["flattened", "child-graph"])
def test_after_a_fault_in_an_inner_block_states_are_as_in_process(iso, child_graph):
    """The child's engine found the faulting block (inside the composite) and reported it before it went:
    until the next child builds, every block is NotCompiled and the composite shows the fault, as an
    in-process engine's blocks after its graph is gone; then the next child's build runs without it."""
    pairs = _both(iso, child_graph)
    (normal, nb), (_, ib) = pairs
    normal.update()
    iso.update()
    _same(pairs)
    normal.faults.disable(nb["pair"].inner("a").id, WHY)  # in process: recovery disables it, the graph goes
    normal.board.graph_gone()
    first = iso._child
    engine, patch = first.server.engine, first.server.patch
    engine.faults.disable(patch.inner[ib["pair"].inner("a").id].id, WHY)  # in the child: the same
    engine.board.graph_gone()
    engine.lost = "CUDA refuses this process"
    assert first.server.lost()  # the report; the child exits
    first.eof = True
    iso.synchronize()
    assert iso._child is not first and iso.restarts == 1
    assert _shown(iso, ib) == _shown(normal, nb)
    assert _shown(iso, ib)["pair"] == ("Error", WHY) and _shown(iso, ib)["src"] == ("NotCompiled", "")
    assert _diags(iso, ib) == _diags(normal, nb)
    normal.context.dirty.mark_structure()  # in process: the next update builds without it
    normal.update()
    iso.update()  # the next child: the whole patch, the faulting block disabled
    shown = _same(pairs)
    assert shown["pair"] == ("Error", WHY) and shown["src"] == ("OK", "")
