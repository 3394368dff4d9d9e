"""Captured library calls at plan level (no GPU): descriptors and pins, placement and dependencies
beside kernel nodes, device scalars, counts, and the shape validation of the built-in blocks."""

from __future__ import annotations

import pytest

from cudapatch import (
    Block,
    BlockBuilder,
    CallDescriptor,
    CudapatchError,
    buffer_in,
    buffer_out,
    compile_plan,
    computed,
    device_scalar,
    host_scalar,
    like,
)
from cudapatch.blocks.library import FFT, GEMM, GEMV, LUSolve, Random, Scale, SpMV
from cudapatch.engine import Context, KernelNodePlan
from cudapatch.engine.context import ExternalBinding
from cudapatch.engine.plan import CapturedNodePlan
from cudapatch.host_plugin import make_plugin_manager
from cudapatch.host_plugin.manager import PluginHost
from cudapatch.kernels.types import DType


def _axpy(stream, pointers, scalars, libs):  # never called here: plans only
    raise AssertionError("a plan test must not capture")


AXPY = CallDescriptor.of(
    "axpy",
    buffer_in("X", "float"),
    buffer_out("Y", "float"),
    host_scalar("N", "int"),
    device_scalar("Alpha", "float"),
    double=False,
)


class Axpy(Block):
    type_name = "Axpy"

    def describe(self, b: BlockBuilder) -> None:
        c = b.add_captured(_axpy, AXPY)
        b.input("X", c.in_("X"))
        b.output("Y", c.out("Y"), size=like("X"))
        c.set_count("N", like("X"))
        b.scalar("Alpha", c.in_("Alpha"), default=2.0)


def _bind(ctx: Context, block: Block, port: str, count: int, dtype: DType = DType.FLOAT32, ptr: int = 0x1000) -> None:
    ctx.bind_input(block, port, ExternalBinding(ptr, count, dtype))


def test_call_descriptor_records_device_scalars_and_constants():
    assert AXPY.entry_point == "axpy"
    assert AXPY.device_scalars == ("Alpha",)
    assert AXPY.is_device_scalar(3) and not AXPY.is_device_scalar(2)
    assert dict(AXPY.constants) == {"double": False}
    assert [p.is_pointer for p in AXPY.parameters] == [True, True, False, False]
    with pytest.raises(ValueError, match="duplicate"):
        CallDescriptor.of("bad", buffer_in("X", "float"), buffer_in("X", "float"))
    with pytest.raises(ValueError, match="not a pointer type"):
        buffer_in("X", "float*")


def test_captured_pins_bind_by_name_and_report_mistakes():
    class Unbound(Block):
        def describe(self, b):
            c = b.add_captured(_axpy, AXPY)
            b.input("X", c.in_("X"))

    with pytest.raises(CudapatchError, match="'Y'.*not bound"):
        Unbound()

    class Unknown(Block):
        def describe(self, b):
            c = b.add_captured(_axpy, AXPY)
            b.input("X", c.in_("Z"))

    with pytest.raises(CudapatchError, match="no parameter 'Z'"):
        Unknown()

    class Grid(Block):
        def describe(self, b):
            b.add_captured(_axpy, AXPY).auto_grid(16)

    with pytest.raises(CudapatchError, match="no grid"):
        Grid()

    class NotADescriptor(Block):
        def describe(self, b):
            b.add_captured(_axpy, "axpy")

    with pytest.raises(CudapatchError, match="CallDescriptor"):
        NotADescriptor()


def test_a_captured_call_becomes_a_child_graph_node_with_its_arguments():
    ctx = Context()
    a = ctx.register_block(Axpy())
    _bind(ctx, a, "X", 1000)
    plan = compile_plan(ctx.snapshot())
    (node,) = plan.nodes
    assert isinstance(node, CapturedNodePlan) and node.entry_point == "axpy"
    x, y, n, alpha = node.args
    assert x.kind == "external" and y.kind == "buffer" and plan.buffers[y.ref].count == 1000
    assert n.kind == "const" and n.value == 1000
    assert alpha.kind == "device" and alpha.value == 2.0 and alpha.ref == (a.id, "Alpha")
    assert plan.scalar_slots[(a.id, "Alpha")] == ((0, 3),)  # a Hot edit finds the device slot
    assert plan.binding_slots[(a.id, "X")] == ((0, 0),)  # a rebind re-captures
    assert "captured axpy" in plan.describe()


def test_kernel_to_call_to_kernel_dependencies_run_both_ways():
    ctx = Context()
    pre = ctx.register_block(Scale(name="pre"))
    mid = ctx.register_block(Axpy(name="mid"))
    post = ctx.register_block(Scale(name="post"))
    _bind(ctx, pre, "In", 4096)
    ctx.connect(pre, "Out", mid, "X")
    ctx.connect(mid, "Y", post, "In")
    plan = compile_plan(ctx.snapshot(), level=__import__("cudapatch").ProfilingLevel.PER_BLOCK)
    (k1,) = (plan.nodes[i] for i in plan.block_nodes[pre.id])
    (c,) = (plan.nodes[i] for i in plan.block_nodes[mid.id])
    (k2,) = (plan.nodes[i] for i in plan.block_nodes[post.id])
    assert isinstance(k1, KernelNodePlan) and isinstance(c, CapturedNodePlan) and isinstance(k2, KernelNodePlan)

    def waits(a, b) -> bool:
        todo = [a.index]
        while todo:
            x = todo.pop()
            if b.index in plan.nodes[x].deps:
                return True
            todo.extend(plan.nodes[x].deps)
        return False

    assert waits(c, k1) and waits(k2, c)
    assert {t.key for t in plan.timings if t.kind == "block"} == {pre.id, mid.id, post.id}  # timed like kernels


def test_a_block_may_mix_kernels_and_calls_in_the_order_it_adds_them():
    from cudapatch.kernels.source import bundled_kernel

    class ScaleThenAxpy(Block):
        def describe(self, b):
            k = b.add_kernel(bundled_kernel("scale"))
            c = b.add_captured(_axpy, AXPY)
            b.input("In", k.in_(0))
            b.connect(k.out(1), c.in_("X"), size=like("In"))
            b.output("Out", c.out("Y"), size=like("In"))
            b.scalar("Factor", k.in_(2), default=1.0)
            b.scalar("Offset", k.in_(3), default=0.0)
            b.scalar("Alpha", c.in_("Alpha"), default=1.0)
            k.auto_grid(like("In"), count_param=4)
            c.set_count("N", like("In"))

    ctx = Context()
    blk = ctx.register_block(ScaleThenAxpy())
    _bind(ctx, blk, "In", 64)
    plan = compile_plan(ctx.snapshot())
    k, c = plan.nodes
    assert isinstance(k, KernelNodePlan) and isinstance(c, CapturedNodePlan)
    assert k.index in c.deps  # the call reads the kernel's internal output


@pytest.mark.parametrize(
    ("block", "params", "inputs", "message"),
    [
        (GEMM, {"M": 4, "N": 5, "K": 6}, {"A": 4 * 7, "B": 6 * 5}, "input 'A' has 28 elements; an 4x6 matrix"),
        (GEMM, {"M": 4, "N": 5, "K": 6}, {"A": 24, "B": 31}, "input 'B' has 31 elements"),
        (GEMV, {"M": 3, "N": 8}, {"A": 24, "X": 3}, "input 'X' has 3 elements"),
        (LUSolve, {"N": 4}, {"A": 9, "B": 4}, "square 3x3 matrix: set N to 3"),
        (LUSolve, {"N": 4}, {"A": 12, "B": 4}, "not a square matrix"),
        (SpMV, {"Rows": 4, "Cols": 4}, {"RowOffsets": 5, "Columns": 7, "Values": 8, "X": 4}, "one column per value"),
        (SpMV, {"Rows": 4, "Cols": 4}, {"RowOffsets": 4, "Columns": 8, "Values": 8, "X": 4}, "Rows + 1 offsets"),
        (FFT, {"Nx": 100}, {"In": 250}, "not a whole number of C2C transforms of size 100"),
        (Random, {"Count": 7, "Normal": 1}, {}, "Count must be even"),
    ],
)
def test_shape_mismatches_are_errors_on_the_block(block, params, inputs, message):
    ctx = Context()
    blk = ctx.register_block(block(**params))
    for port, count in inputs.items():
        dtype = blk.description.input(port).dtype
        _bind(ctx, blk, port, count, dtype)
    plan = compile_plan(ctx.snapshot())
    assert not plan.nodes and plan.skipped == (blk.id,)
    (diag,) = plan.diagnostics
    assert diag.severity == "error" and diag.code == "library-shape" and diag.block_id == blk.id
    assert message in diag.message, diag.message


def test_builtin_blocks_plan_their_outputs_and_counts():
    ctx = Context()
    g = ctx.register_block(GEMM(M=3, N=5, K=4))
    _bind(ctx, g, "A", 12)
    _bind(ctx, g, "B", 20)
    f = ctx.register_block(FFT(Kind="R2C", Nx=64))
    _bind(ctx, f, "In", 64 * 10)
    r = ctx.register_block(Random(Count=100, Precision="double"))
    lu = ctx.register_block(LUSolve(N=3, NRHS=2))
    _bind(ctx, lu, "A", 9)
    _bind(ctx, lu, "B", 6)
    plan = compile_plan(ctx.snapshot())
    assert plan.buffers[plan.outputs[(g.id, "C")]].count == 15
    out = plan.buffers[plan.outputs[(f.id, "Out")]]
    assert out.count == 10 * 33 and out.dtype is DType.FLOAT2
    (fft,) = (plan.nodes[i] for i in plan.block_nodes[f.id])
    assert dict((p.name, a.value) for p, a in zip(fft.descriptor.parameters, fft.args, strict=True))["Batch"] == 10
    assert plan.buffers[plan.outputs[(r.id, "Out")]].dtype is DType.FLOAT64
    assert plan.buffers[plan.outputs[(lu.id, "X")]].count == 6 and plan.buffers[plan.outputs[(lu.id, "LU")]].count == 9
    assert all(isinstance(n, CapturedNodePlan) for n in plan.nodes)


def test_sizes_read_by_validation_are_structural_and_descriptions_compare_equal():
    g = GEMM()
    assert {p.name for p in g.description.params if p.structural} == {"M", "N", "K"}
    assert not g.description.param("TransA").structural and not g.description.param("Alpha").structural
    assert GEMM().description == GEMM().description  # call functions are module-level: no spurious rebuilds
    assert FFT(Kind="C2R").description == FFT(Kind="C2R").description
    with pytest.raises(CudapatchError, match="Precision"):
        GEMM(Precision="half")
    with pytest.raises(CudapatchError, match="Kind"):
        FFT(Kind="R2R")


def test_computed_size_rules():
    rule = computed(lambda n, v: n // v["K"], "K", like="X")
    assert rule.resolve(100, {"K": 4}) == 25 and rule.params == ("K",)
    assert "like 'X'" in str(rule)
    with pytest.raises(ValueError):
        type(rule)(param="A", fn=lambda n, v: 1)


def test_library_block_types_are_registered_by_the_builtin_plugin():
    host = PluginHost(make_plugin_manager(entry_points=False))
    for name in ("linalg.GEMM", "linalg.GEMV", "linalg.LUSolve", "linalg.SpMV", "signal.FFT", "signal.Random"):
        assert name in host.registry
    gemm = host.registry.get("linalg.GEMM")
    assert "cuBLAS" in gemm.doc


def test_library_errors_carry_the_status_name_and_context():
    from types import SimpleNamespace

    from cudapatch.engine.libraries import LibraryHandles, library_error
    from cudapatch.errors import LibraryCallError

    class FakeCublasError(Exception):
        pass

    err = library_error(FakeCublasError("CUBLAS_STATUS_INVALID_VALUE (7)"), "gemm", "mix")
    assert isinstance(err, LibraryCallError) and err.status == "CUBLAS_STATUS_INVALID_VALUE"
    assert str(err).startswith("block 'mix', kernel 'gemm': FakeCublasError")
    assert library_error(RuntimeError("boom"), "fft", None).status is None
    # Inside a capture, a plan or generator that was not prepared is refused, naming the fix.
    handles = LibraryHandles(SimpleNamespace(compute_capability=(9, 0)), pool=None)
    assert handles.cublas_workspace_bytes == 32 << 20
    scope = handles.scope((1, 0))
    assert handles.scope((1, 0)) is scope and handles.scope_count == 1
    handles.capturing = True
    with pytest.raises(LibraryCallError, match="prepare step"):
        scope.fft_plan("C2C", (256,), 4)
    with pytest.raises(LibraryCallError, match="prepare step"):
        scope.generator("PSEUDO_DEFAULT", 7)
