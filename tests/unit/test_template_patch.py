"""A prepared Warm patch that changes most of a large graph's nodes writes their new values into the
template graph on the build thread and applies them with one ``cuGraphExecUpdate`` at the swap
(``CompiledGraph._write_template``): the executable ends up holding exactly what the node-by-node
patch gives it (arguments, grids, functions), with a bypass in place, over growths and shrinks, and
it falls back to the node-by-node patch where the driver refuses the update or the template was
rewritten meanwhile."""

from __future__ import annotations

import ctypes
import random

import pytest

from cudapatch import DType, Scale
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine import executable as executable_module
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.bypass import BypassIndex, plan_bypass
from cudapatch.engine.executable import CompiledGraph
from cudapatch.engine.nodes import KernelNode
from cudapatch.engine.warm import WarmPatch, decide_warm_patch

from .recording_driver import OK, RecordingDriver, install, real, realize_recorded
from .unfused import compile_plan


class ValuesDriver(RecordingDriver):
    """Keeps what each node holds in the template graph and in each executable, read from the
    parameter structs at each call (as the driver copies them); ``cuGraphExecUpdate`` copies the
    template's values into the executable."""

    refuse = False

    def __init__(self) -> None:
        super().__init__()
        self.types: dict[str, list] = {}  # node -> its argument ctypes (the test fills it in)
        self.template: dict[str, tuple] = {}
        self.execs: dict[tuple[str, str], tuple] = {}

    def _read(self, node: str, kp) -> tuple:
        types = self.types[node]
        ptrs = (ctypes.c_void_p * len(types)).from_address(int(kp.kernelParams))
        values = tuple(t.from_address(p).value for t, p in zip(types, ptrs, strict=True))
        return values, kp.gridDimX, kp.gridDimY, kp.gridDimZ, int(kp.func)

    def cuGraphAddKernelNode(self, graph, deps, n, kp):  # noqa: N802
        ok, h = super().cuGraphAddKernelNode(graph, deps, n, kp)
        self.pending = getattr(self, "pending", [])
        self.pending.append((h, kp))
        return ok, h

    def learn(self, g: CompiledGraph) -> None:
        """The node types, and the template's and executable's first values (from instantiation)."""
        for kn in g._nodes:
            if isinstance(kn, KernelNode):
                self.types[kn.handle] = [type(s) for s in kn.slots]
                self.template[kn.handle] = self.execs[(g.handle, kn.handle)] = self._read(kn.handle, kn.params)

    def cuGraphExecKernelNodeSetParams(self, exec_, node, kp):  # noqa: N802
        self._rec("set_params", node, kp.gridDimX)
        self.execs[(exec_, node)] = self._read(node, kp)
        return (OK,)

    def cuGraphKernelNodeSetParams(self, node, kp):  # noqa: N802
        self._rec("template_params", node)
        self.template[node] = self._read(node, kp)
        return (OK,)

    def cuGraphExecUpdate(self, exec_, graph):  # noqa: N802
        self._rec("exec_update", exec_, graph)
        if self.refuse:
            return real.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, None
        for node, values in self.template.items():
            self.execs[(exec_, node)] = values
        return OK, None


@pytest.fixture
def drv(monkeypatch) -> ValuesDriver:
    monkeypatch.setattr(executable_module, "TEMPLATE_PATCH_MIN_NODES", 8)
    return install(monkeypatch, ValuesDriver())


def _chain(n: int, count: int) -> tuple[Context, list]:
    ctx = Context()
    blocks = [ctx.register_block(Scale(name=f"s{i}", Factor=float(i + 2), Offset=0.5 * i)) for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, count, DType.FLOAT32))
    return ctx, blocks


def _held(drv: ValuesDriver, g: CompiledGraph) -> list:
    """What the executable holds per kernel node, buffer addresses as buffer indices."""
    where = {b.ptr: f"buf{i}" for i, b in enumerate(g.buffers)}
    out = []
    for kn in g._nodes:
        if isinstance(kn, KernelNode):
            values, *launch = drv.execs[(g.handle, kn.handle)]
            out.append(([where.get(v, v) for v in values], *launch))
    return out


def _patch(g: CompiledGraph, ctx: Context, *, prepared: bool) -> int | None:
    snap = ctx.snapshot()
    new = compile_plan(snap, reuse=False)  # a buffer per value: a bypass redirects the reader
    d = decide_warm_patch(g.plan, new, snap.bindings, capacities=[b.capacity_bytes for b in g.buffers])
    assert isinstance(d, WarmPatch)
    d = g.trim_patch(d)
    if not prepared:
        return g.try_patch(new, snap.bindings, decided=d)
    p = g.prepare_patch(d, snap.bindings)
    assert p is not None
    return g.apply_prepared(p, new)


@pytest.mark.parametrize("seed", range(5))
def test_a_template_patch_leaves_the_executable_as_the_node_by_node_patch(drv: ValuesDriver, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(12, 30)
    ctx, blocks = _chain(n, 1000)
    plan = compile_plan(ctx.snapshot(), reuse=False)
    a, b = (realize_recorded(ctx, plan, BufferPool()) for _ in range(2))
    for g in (a, b):
        g.adopt(None)
        drv.learn(g)
    mid = blocks[rng.randrange(1, n - 1)].id
    for g in (a, b):  # a bypassed block: its reader reads its input (after the update too), its node stays off
        g.set_bypass(plan_bypass(BypassIndex(g.plan), {mid}))
    assert b.bypass.redirects and b.bypass.disabled
    templates = 0
    for _ in range(4):
        count = rng.choice([300, 2000, 5000, 20000])
        ctx.bind_input(blocks[0], "In", ExternalBinding(0xB000 + count, count, DType.FLOAT32))
        expected = _patch(a, ctx, prepared=False)
        drv.calls.clear()
        assert _patch(b, ctx, prepared=True) == expected
        for g in (a, b):  # as the engine's bypass tier does after every patch (``try_patch`` leaves redirects)
            g.set_bypass(plan_bypass(BypassIndex(g.plan), {mid}))
        updated = [c for c in drv.calls if c[0] == "exec_update"]
        templates += bool(updated)
        if updated:  # one update; node-by-node calls only for the redirected reader(s)
            assert len([c for c in drv.calls if c[0] == "set_params"]) <= 4
            disabled = [c for c in drv.calls if c[0] == "set_enabled"]
            assert {c[2] for c in disabled} == {b._nodes[i].handle for i in b.bypass.disabled}
            assert all(c[3] == 0 for c in disabled)
        assert _held(drv, a) == _held(drv, b)
        assert [x.count for x in a.buffers] == [x.count for x in b.buffers]
    assert templates >= 1  # a growth changes every node's count: the template path ran
    a.close()
    b.close()


def test_a_refused_update_falls_back_to_the_node_by_node_patch(drv: ValuesDriver) -> None:
    ctx, blocks = _chain(16, 1000)
    plan = compile_plan(ctx.snapshot(), reuse=False)
    a, b = (realize_recorded(ctx, plan, BufferPool()) for _ in range(2))
    for g in (a, b):
        g.adopt(None)
        drv.learn(g)
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xB000, 4000, DType.FLOAT32))
    _patch(a, ctx, prepared=False)
    drv.refuse = True
    drv.calls.clear()
    _patch(b, ctx, prepared=True)
    assert "exec_update" in drv.names() and len([c for c in drv.calls if c[0] == "set_params"]) == 16
    assert _held(drv, a) == _held(drv, b)


def test_a_template_rewritten_before_the_swap_is_not_applied(drv: ValuesDriver) -> None:
    ctx, blocks = _chain(16, 1000)
    g = realize_recorded(ctx, compile_plan(ctx.snapshot(), reuse=False), BufferPool())
    g.adopt(None)
    drv.learn(g)
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xB000, 4000, DType.FLOAT32))
    snap = ctx.snapshot()
    new = compile_plan(snap, reuse=False)
    d = g.trim_patch(decide_warm_patch(g.plan, new, snap.bindings, capacities=[b.capacity_bytes for b in g.buffers]))
    p = g.prepare_patch(d, snap.bindings)
    assert p is not None and p.template is not None
    g._template_epoch += 1  # what ``_start_body_fallback`` does when it rewrites the template
    drv.calls.clear()
    g.apply_prepared(p, new)
    assert "exec_update" not in drv.names() and len([c for c in drv.calls if c[0] == "set_params"]) == 16
