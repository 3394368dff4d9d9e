"""The recording stand-ins for the CUDA driver the realize tests share (no GPU): cuda-bindings'
structs and enums are the real ones; only the ``cu*`` functions are recorded. ``RecordingDriver``
records plain graphs, ``ChildGraphDriver`` child-graph nodes too, ``RegionDriver`` conditional nodes
and the graph each node goes into; ``install`` puts one in place, ``realize_recorded`` and
``realize_regions`` realize a plan on it; ``plain_value_calls`` gives a realized graph held calls on
plain values that record as its calls on handles do."""

from __future__ import annotations

import ctypes
import itertools
from collections import Counter
from typing import Any, TypeVar

from cuda.bindings import driver as real

import cudapatch.kernels._driver as driver_module
from cudapatch.engine import Context, realize
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.nodes import KernelNode
from cudapatch.engine.plan import KernelNodePlan
from cudapatch.kernels.held_calls import RawCalls

OK = real.CUresult.CUDA_SUCCESS


class RecordingDriver:
    """``cu*`` calls append ``(name, ...)`` to ``calls`` and succeed; everything else is cuda-bindings'."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._ids = itertools.count(1)
        self._keep: list[Any] = []
        self.free = 80 << 30  # what cuMemGetInfo reports free (the memory check before a build)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("cu"):
            raise AttributeError(f"the recording driver has no {name}")
        return getattr(real, name)

    def _handle(self, kind: str) -> str:
        return f"{kind}{next(self._ids)}"

    def _rec(self, *call: Any) -> None:
        self.calls.append(call)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def cuCtxGetCurrent(self):  # noqa: N802 - the driver's names; owners note their context when armed
        return OK, real.CUcontext(0x77)

    def cuCtxGetId(self, ctx):  # noqa: N802
        return OK, 1

    def cuMemAlloc(self, n):  # noqa: N802
        return OK, 0x1000_0000 * next(self._ids)

    def cuMemFree(self, p):  # noqa: N802
        return (OK,)

    def cuMemGetInfo(self):  # noqa: N802
        return OK, self.free, 80 << 30

    def cuMemHostAlloc(self, n, flags):  # noqa: N802
        buf = ctypes.create_string_buffer(n)
        self._keep.append(buf)
        return OK, ctypes.addressof(buf)

    def cuMemFreeHost(self, p):  # noqa: N802
        return (OK,)

    def cuMemHostGetDevicePointer(self, p, flags):  # noqa: N802
        return OK, p

    def cuMemsetD32Async(self, *a):  # noqa: N802
        return (OK,)

    def cuGraphCreate(self, flags):  # noqa: N802
        h = self._handle("graph")
        self._rec("create_graph", h)
        return OK, h

    def cuGraphAddKernelNode(self, graph, deps, n, kp):  # noqa: N802
        h = self._handle("kernel")
        self._rec("add_kernel", h, tuple(deps), int(kp.func), kp.gridDimX)
        return OK, h

    def cuGraphAddMemsetNode(self, graph, deps, n, mp, ctx):  # noqa: N802
        h = self._handle("memset")
        self._rec("add_memset", h, tuple(deps))
        return OK, h

    def cuGraphAddDependencies(self, graph, froms, tos, edges, n):  # noqa: N802
        self._rec("add_edges", tuple(froms), tuple(tos))
        return (OK,)

    def cuGraphInstantiate(self, graph, flags):  # noqa: N802
        self._rec("instantiate", graph)
        return OK, self._handle("exec")

    def cuGraphLaunch(self, exec_, stream):  # noqa: N802
        self._rec("launch", exec_)
        return (OK,)

    def cuGraphExecKernelNodeSetParams(self, exec_, node, kp):  # noqa: N802
        self._rec("set_params", node, kp.gridDimX)
        return (OK,)

    refuse_update = False

    def cuGraphExecUpdate(self, exec_, graph):  # noqa: N802
        self._rec("exec_update", exec_, graph)
        if self.refuse_update:
            return real.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, None
        return OK, None

    def cuGraphNodeSetEnabled(self, exec_, node, on):  # noqa: N802
        self._rec("set_enabled", exec_, node, on)
        return (OK,)

    def cuGraphExecDestroy(self, exec_):  # noqa: N802
        self._rec("destroy_exec", exec_)
        return (OK,)

    def cuGraphDestroy(self, graph):  # noqa: N802
        self._rec("destroy_graph", graph)
        return (OK,)

    def cuEventCreate(self, flags):  # noqa: N802
        return OK, self._handle("event")

    def cuEventRecord(self, event, stream):  # noqa: N802
        return (OK,)

    def cuEventQuery(self, event):  # noqa: N802
        return (OK,)

    def cuEventDestroy(self, event):  # noqa: N802
        return (OK,)


class StubDevice:
    """The device attributes ``realize`` reads (an H100's), and nothing to make current."""

    compute_capability = (9, 0)
    max_threads_per_multiprocessor = 2048
    stream = 0
    context = None

    def make_current(self) -> None:
        pass


def realize_recorded(ctx, plan, pool, **kw):
    """``realize`` on ``StubDevice``, each block's kernel 0 being function ``100 + block id``."""
    snap = ctx.snapshot()
    functions = {(b.id, 0): 100 + b.id for b in snap.blocks}
    kw.setdefault("functions", functions)
    names = {b.id: b.name for b in snap.blocks}
    return realize(plan, device=StubDevice(), pool=pool, bindings=snap.bindings, block_names=names, **kw)  # type: ignore[arg-type]


class ChildGraphDriver(RecordingDriver):
    """Also records child-graph nodes, the graph each node goes into, and updates through child graphs."""

    def cuGraphAddKernelNode(self, graph, deps, n, kp):  # noqa: N802
        ok, h = super().cuGraphAddKernelNode(graph, deps, n, kp)
        self.calls[-1] = (*self.calls[-1], graph)
        return ok, h

    def cuGraphAddChildGraphNode(self, graph, deps, n, child):  # noqa: N802
        h = self._handle("child")
        self._rec("add_child", h, tuple(deps), graph, child)
        return OK, h

    def cuGraphChildGraphNodeGetGraph(self, node):  # noqa: N802
        return OK, f"embedded-{node}"

    def cuGraphKernelNodeSetParams(self, node, kp):  # noqa: N802
        self._rec("template_params", node)
        return (OK,)

    def cuGraphExecChildGraphNodeSetParams(self, exec_, node, graph):  # noqa: N802
        self._rec("child_params", node, graph)
        return (OK,)


class RegionDriver(RecordingDriver):
    """Records which graph each node goes into; conditional handles are numbered from 7000."""

    def __init__(self, refuse_body_updates: bool = False) -> None:
        super().__init__()
        self.refuse = refuse_body_updates
        self.body_nodes: set[str] = set()
        self.graph_of: dict[str, Any] = {}

    def cuGraphConditionalHandleCreate(self, graph, ctx, default, flags):  # noqa: N802
        self._rec("handle", graph, default, flags)
        return OK, real.CUgraphConditionalHandle(7000 + len(self.calls))

    def cuGraphAddNode(self, graph, deps, data, n, params):  # noqa: N802
        h = self._handle("cond")
        c = params.conditional
        self._rec("add_conditional", h, graph, tuple(deps), int(c.handle), c.type, c.size)
        self.graph_of[h] = graph
        return OK, h

    def cuGraphAddKernelNode(self, graph, deps, n, kp):  # noqa: N802
        out = super().cuGraphAddKernelNode(graph, deps, n, kp)
        self.graph_of[out[1]] = graph
        if str(graph) != str(self.root):
            self.body_nodes.add(out[1])
        return out

    def cuGraphCreate(self, flags):  # noqa: N802
        out = super().cuGraphCreate(flags)
        self.root = out[1]
        return out

    def cuGraphExecKernelNodeSetParams(self, exec_, node, kp):  # noqa: N802
        if self.refuse and node in self.body_nodes:
            self._rec("set_params_refused", node)
            return (real.CUresult.CUDA_ERROR_INVALID_VALUE,)
        return super().cuGraphExecKernelNodeSetParams(exec_, node, kp)

    def cuGraphKernelNodeSetParams(self, node, kp):  # noqa: N802
        self._rec("template_params", node)
        return (OK,)

    def cuGraphExecUpdate(self, exec_, graph):  # noqa: N802
        self._rec("exec_update", exec_, graph)
        return OK, None


D = TypeVar("D", bound=RecordingDriver)


def install(monkeypatch, fake: D) -> D:
    """Make ``fake`` the driver ``cudapatch`` calls for the rest of the test."""
    monkeypatch.setattr(driver_module, "_driver", fake)
    return fake


def realize_regions(ctx: Context, plan, pool: BufferPool):
    """``realize`` on ``StubDevice`` for plans with regions: kernel ``k`` of a block is function
    ``100 + 10 * block id + k % 10`` (a region has several), the publish kernel function 3."""
    snap = ctx.snapshot()
    functions: dict[tuple[int, int], Any] = {}
    for n in plan.nodes:
        if isinstance(n, KernelNodePlan):
            functions[(n.block_id, n.kernel)] = 100 + n.block_id * 10 + (n.kernel % 10)
    names = {b.id: b.name for b in snap.blocks}
    return realize(
        plan,
        device=StubDevice(),
        pool=pool,
        bindings=snap.bindings,
        block_names=names,
        functions=functions,
        publish_function=3,
    )  # type: ignore[arg-type]


def plain_value_calls(g: Any, rec: RecordingDriver) -> Counter:
    """Give ``g`` held calls on plain values that record as the recording driver's calls on handles do
    (the value back to its handle; the parameters' grid read at the address given), as where the
    driver gives the held entry points. Returns the count of those calls by name, as they are made."""
    exec_value = 0x7E00
    made: Counter = Counter()  # the calls on plain values, by name
    by_value: dict[int, str] = {}
    structs = {}
    for i, kn in enumerate(g._nodes):
        if isinstance(kn, KernelNode) and kn.params is not None:
            kn.hid = 0x100 + i  # (the recording driver's handles are names: no ``int()``)
            by_value[kn.hid] = kn.handle
            structs[kn.params.getPtr()] = kn.params

    def set_params(exec_: int, node: int, params: int) -> int:
        assert exec_ == exec_value and type(node) is int and type(params) is int
        made["set_params"] += 1
        rec.calls.append(("set_params", by_value[node], structs[params].gridDimX))
        return 0

    def set_enabled(exec_: int, node: int, on: int) -> int:
        assert exec_ == exec_value and type(node) is int
        made["set_enabled"] += 1
        rec.calls.append(("set_enabled", g._exec, by_value[node], on))
        return 0

    g._raw, g._exec_i = RawCalls(set_params, set_enabled), exec_value
    return made
