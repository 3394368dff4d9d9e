"""Fusion on a real GPU (on by default): fused chains and trees (two branches from blocks' outputs,
joined) give the unfused results bit for bit,
Hot edits of a member's scalar patch the fused node, a member's Code edit regenerates the fused
kernel, a fused intermediate read by the host raises once and is kept in a buffer from the next
update on (also through an isolated engine), a bypassed member leaves its group, and a plugin whose
``k.elementwise`` declaration does not fit runs unfused with a warning."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import BlockState, CudapatchError, Engine, Expression, Scale, VectorAdd
from cudapatch.engine.compiler.fusion import FUSED_KERNEL

from .conftest import run_until

pytestmark = pytest.mark.gpu  # the conftest's ``engine`` fuses: fusion is the default


def _patch(e: Engine, x: np.ndarray, y: np.ndarray, *, fuse: bool) -> tuple[list, object]:
    """x → Scale → Expression(+ y) → Scale → VectorAdd(+ x): a chain with a second input, one sink."""
    s1 = e.add(Scale(Factor=1.7, Offset=-0.3, fuse=fuse))
    ex = e.add(Expression(Code="sin(a * Freq) * b + a / (1 + b * b)", Freq=2.5, fuse=fuse))
    s2 = e.add(Scale(Factor=0.9, Offset=0.1, fuse=fuse))
    add = e.add(VectorAdd(fuse=fuse))
    e.bind(s1, "In", x)
    e.bind(ex, "b", y)
    e.bind(add, "B", x)
    e.connect(s1, "Out", ex, "a")
    e.connect(ex, "Out", s2, "In")
    e.connect(s2, "Out", add, "A")
    return [s1, ex, s2, add], add


@pytest.mark.parametrize("count", [1 << 20, 1000])  # 4 elements a thread; 1 a thread (128-thread blocks)
def test_fused_chain_equals_unfused_bitwise(engine: Engine, rng: np.random.Generator, count: int) -> None:
    e = engine
    x, y = (rng.standard_normal(count).astype(np.float32) for _ in range(2))
    fused, fused_sink = _patch(e, x, y, fuse=True)
    _, plain_sink = _patch(e, x, y, fuse=False)  # the same blocks, each on its own node
    e.update()
    nodes = e.graph.plan.kernel_nodes
    assert len(nodes) == 1 + 4 and sum(n.kernel == FUSED_KERNEL for n in nodes) == 1
    assert all(e.graph.plan.block_nodes[b.id] == e.graph.plan.block_nodes[fused_sink.id] for b in fused)
    np.testing.assert_array_equal(e.read(fused_sink, "Sum"), e.read(plain_sink, "Sum"))


def _tree(e: Engine, x: np.ndarray, y: np.ndarray, join: str) -> tuple[list, object, object]:
    """Two elementwise branches from one source joined by ``join`` (``VectorAdd`` or ``Expression``), the
    right branch also reading another block's output: a tree whose inputs come from blocks, not the host.

    ``src`` and ``other`` opt out of fusion (buffers of their own); ``left`` reads ``src``, ``scale``
    reads ``src`` too and feeds ``right``, which reads ``other`` as well. Returns the tree's members (the
    sink last), ``(the sink, its output port)`` and ``left``, whose ``Freq`` the test changes.
    """
    src = e.add(Scale(name="src", Factor=1.25, Offset=-0.5, fuse=False))
    other = e.add(Scale(name="other", Factor=0.5, Offset=0.25, fuse=False))
    left = e.add(Expression(name="left", Code="a * Freq + a / (1 + a * a)", Freq=2.5))
    scale = e.add(Scale(name="scale", Factor=0.75, Offset=0.125))
    right = e.add(Expression(name="right", Code="u * v - Bias", Bias=0.5))
    e.bind(src, "In", x)
    e.bind(other, "In", y)
    e.connect(src, "Out", left, "a")
    e.connect(src, "Out", scale, "In")
    e.connect(scale, "Out", right, "u")
    e.connect(other, "Out", right, "v")
    if join == "VectorAdd":
        sink, out, ports = e.add(VectorAdd(name="join")), "Sum", ("A", "B")
    else:
        sink = e.add(Expression(name="join", Code="l * Mix + r", Inputs="l, r", Mix=0.25))
        out, ports = "Out", ("l", "r")
    e.connect(left, "Out", sink, ports[0])
    e.connect(right, "Out", sink, ports[1])
    return [left, scale, right, sink], (sink, out), left


@pytest.mark.parametrize("join", ["VectorAdd", "Expression"])
def test_a_fused_tree_of_two_branches_from_blocks_equals_unfused_bitwise_and_takes_a_branchs_hot_edit(
    engine: Engine, unfused_engine: Engine, rng: np.random.Generator, join: str
) -> None:
    x, y = (rng.standard_normal(100_003).astype(np.float32) for _ in range(2))
    members, (sink, out), left = _tree(engine, x, y, join)
    _, (plain_sink, _), plain_left = _tree(unfused_engine, x, y, join)
    for e in (engine, unfused_engine):
        e.update()
    plan = engine.graph.plan
    assert len(plan.kernel_nodes) == 3 and sum(n.kernel == FUSED_KERNEL for n in plan.kernel_nodes) == 1
    (fused,) = [n for n in plan.kernel_nodes if n.kernel == FUSED_KERNEL]
    assert all(plan.block_nodes[b.id] == (fused.index,) for b in members)  # one group: the whole tree
    assert len(unfused_engine.graph.plan.kernel_nodes) == 6
    got = engine.read(sink, out)
    np.testing.assert_array_equal(got, unfused_engine.read(plain_sink, out))

    def reference(freq: float) -> np.ndarray:  # float64: the f32 kernels round each step, so only close
        a = x.astype(np.float64) * 1.25 - 0.5
        v = y.astype(np.float64) * 0.5 + 0.25
        lhs, rhs = a * freq + a / (1 + a * a), (a * 0.75 + 0.125) * v - 0.5
        return lhs + rhs if join == "VectorAdd" else lhs * 0.25 + rhs

    np.testing.assert_allclose(got, reference(2.5), rtol=1e-5, atol=1e-5)
    rebuilds, hot = engine.counters.rebuilds, engine.counters.hot_updates
    for block in (left, plain_left):
        block.set("Freq", -1.75)  # one branch's Hot scalar: a slot of the fused node
    for e in (engine, unfused_engine):
        e.update()
    assert engine.counters.rebuilds == rebuilds and engine.counters.hot_updates > hot
    changed = engine.read(sink, out)
    np.testing.assert_array_equal(changed, unfused_engine.read(plain_sink, out))
    np.testing.assert_allclose(changed, reference(-1.75), rtol=1e-5, atol=1e-5)
    assert not np.array_equal(changed, got)


def test_hot_edit_of_a_member_patches_the_fused_node(engine: Engine, rng: np.random.Generator) -> None:
    e = engine
    x = rng.standard_normal(10_000).astype(np.float32)
    a = e.add(Scale(name="a", Factor=2.0, Offset=0.0))
    b = e.add(Scale(name="b", Factor=3.0, Offset=1.0))
    e.bind(a, "In", x)
    e.connect(a, "Out", b, "In")
    e.update()
    rebuilds = e.counters.rebuilds
    a.set("Factor", -1.0)
    b.set("Offset", 0.5)
    e.update()
    assert e.counters.rebuilds == rebuilds and e.counters.hot_updates >= 2
    ref = ((-x).astype(np.float64) * 3.0 + 0.5).astype(np.float32)  # fma(fma(x, -1, 0), 3, 0.5): one rounding each
    np.testing.assert_array_equal(e.read(b, "Out"), ref)


def test_code_edit_of_a_member_regenerates_the_fused_kernel(rng: np.random.Generator) -> None:
    x = rng.standard_normal(4096).astype(np.float32)
    with Engine(fuse=True) as e:
        ex = e.add(Expression(name="ex", Code="x * 2"))
        s = e.add(Scale(name="s", Factor=1.0, Offset=1.0))
        e.bind(ex, "x", x)
        e.connect(ex, "Out", s, "In")
        run_until(e, lambda: s.debug.state is BlockState.OK and len(e.graph.plan.kernel_nodes) == 1)
        np.testing.assert_array_equal(e.read(s, "Out"), x * np.float32(2) + np.float32(1))
        graph, rebuilds = e.graph, e.counters.rebuilds
        ex.set("Code", "x * 3")  # same names: the group's kernel is generated again and swapped in (Code tier)
        run_until(e, lambda: e.counters.code_swaps >= 1, timeout=20)
        e.update()
        np.testing.assert_array_equal(e.read(s, "Out"), x * np.float32(3) + np.float32(1))
        assert e.graph is graph and e.counters.rebuilds == rebuilds
        ex.set("Code", "x * 3 + y")  # a new input: re-described, rebuilt, fused again
        e.bind(ex, "y", x)
        run_until(e, lambda: e.counters.rebuilds > rebuilds and s.debug.state is BlockState.OK, timeout=20)
        e.update()
        np.testing.assert_array_equal(e.read(s, "Out"), (x * np.float32(3) + x) + np.float32(1))
        assert len(e.graph.plan.kernel_nodes) == 1


def test_a_fused_intermediate_read_by_the_host_raises_once_then_is_kept(rng: np.random.Generator) -> None:
    x = rng.standard_normal(512).astype(np.float32)
    with Engine(wait_for_compile=True) as e:
        a = e.add(Scale(name="a", Factor=2.0))
        b = e.add(Scale(name="b", Factor=3.0))
        kept = e.add(Scale(name="kept", Factor=5.0, fuse=False))  # the per-block opt-out
        c = e.add(Scale(name="c", Factor=7.0))
        e.bind(a, "In", x)
        e.connect(a, "Out", b, "In")
        e.connect(b, "Out", kept, "In")
        e.connect(kept, "Out", c, "In")
        e.update()
        assert len(e.graph.plan.kernel_nodes) == 3  # a+b fused, kept alone, c alone
        with pytest.raises(CudapatchError, match="fused kernel"):
            e.read(a, "Out")
        np.testing.assert_array_equal(e.read(kept, "Out"), ((x * np.float32(2)) * np.float32(3)) * np.float32(5))
        e.update()  # the build that keeps a.Out: the group ends at a
        np.testing.assert_array_equal(e.read(a, "Out"), x * np.float32(2))
        assert len(e.graph.plan.kernel_nodes) == 4
    with Engine(wait_for_compile=True) as e:  # kept before the first update: never fused away, no error
        a, b = e.add(Scale(name="a", Factor=2.0)), e.add(Scale(name="b", Factor=3.0))
        e.bind(a, "In", x)
        e.connect(a, "Out", b, "In")
        e.keep(a, "Out")
        e.update()
        np.testing.assert_array_equal(e.read(a, "Out"), x * np.float32(2))
        np.testing.assert_array_equal(e.read(b, "Out"), (x * np.float32(2)) * np.float32(3))


def test_an_isolated_engine_fuses_and_keeps_what_the_host_reads(rng: np.random.Generator) -> None:
    x = rng.standard_normal(4096).astype(np.float32)
    with Engine(isolated=True, wait_for_compile=True) as e:
        a, b = e.add(Scale(name="a", Factor=2.0)), e.add(Scale(name="b", Factor=3.0, Offset=1.0))
        e.bind(a, "In", x)
        e.connect(a, "Out", b, "In")
        e.wait_ready()
        e.update()
        ref = (x * np.float32(2)).astype(np.float64) * 3 + 1  # Scale is one fused multiply-add
        np.testing.assert_allclose(e.read(b, "Out"), ref, rtol=1e-6, atol=1e-6)
        assert {r.name: r.fused for r in e.stats().blocks} == {"a": "a -> b", "b": "a -> b"}  # fused in the child
        with pytest.raises(CudapatchError, match="fused kernel"):
            e.output(a, "Out")  # in no buffer of the child's graph
        e.update()  # the keep goes to the child with this frame's edits; the child rebuilds
        e.wait_ready()
        e.update()
        e.synchronize()
        np.testing.assert_array_equal(np.asarray(e.read(a, "Out")), x * np.float32(2))
        assert e.output(a, "Out").nbytes == 4 * x.size


def test_bypassing_a_fused_member_takes_it_out_of_its_group(engine: Engine, rng: np.random.Generator) -> None:
    e = engine
    x = rng.standard_normal(4096).astype(np.float32)
    s1, s2, s3 = (e.add(Scale(name=f"s{i}", Factor=float(i + 2))) for i in range(3))
    e.bind(s1, "In", x)
    e.connect(s1, "Out", s2, "In")
    e.connect(s2, "Out", s3, "In")
    e.update()
    assert len(e.graph.plan.kernel_nodes) == 1
    s2.enabled = False  # the same update rebuilds with s2 on its own (disabled) node: s3 reads s1's output
    e.update()
    np.testing.assert_array_equal(e.read(s3, "Out"), (x * np.float32(2)) * np.float32(4))
    assert len(e.graph.plan.kernel_nodes) == 3 and not s2.debug.fused
    s2.enabled = True
    e.update()
    np.testing.assert_array_equal(e.read(s3, "Out"), ((x * np.float32(2)) * np.float32(3)) * np.float32(4))


def test_a_waiting_engine_runs_a_members_code_edit_in_the_next_frame(engine: Engine, rng: np.random.Generator) -> None:
    e = engine
    x = rng.standard_normal(4096).astype(np.float32)
    ex = e.add(Expression(name="ex", Code="x * 2"))
    s = e.add(Scale(name="s", Factor=1.0, Offset=1.0))
    e.bind(ex, "x", x)
    e.connect(ex, "Out", s, "In")
    e.update()
    graph, swaps = e.graph, e.counters.code_swaps
    ex.set("Code", "x * 5")
    e.update()  # waits for the regenerated group kernel, swaps it in, launches it
    np.testing.assert_array_equal(e.read(s, "Out"), x * np.float32(5) + np.float32(1))
    assert e.graph is graph and e.counters.code_swaps == swaps + 1


def test_several_elements_per_thread_cover_an_odd_count_bitwise(engine: Engine, rng: np.random.Generator) -> None:
    from cudapatch.engine.compiler.fusion import FUSED_PER_THREAD, FUSED_PER_THREAD_FROM

    e = engine
    n = FUSED_PER_THREAD_FROM + 37  # the last block covers 37 elements: the other threads' stores are masked
    x = rng.standard_normal(n).astype(np.float32)

    def chain(fuse: bool) -> object:
        s = e.add(Scale(Factor=1.1, Offset=0.2, fuse=fuse))
        ex = e.add(Expression(Code="a * Gain + float(index % 5)", Gain=0.75, fuse=fuse))  # uses the element index
        e.bind(s, "In", x)
        e.connect(s, "Out", ex, "a")
        return ex

    fused, plain = chain(True), chain(False)
    e.update()
    (node,) = [k for k in e.graph.plan.kernel_nodes if k.kernel == FUSED_KERNEL]
    assert node.source.per_thread == FUSED_PER_THREAD
    got = e.read(fused, "Out")
    np.testing.assert_array_equal(got, e.read(plain, "Out"))
    expected = (x * np.float32(1.1) + np.float32(0.2)) * np.float32(0.75) + (np.arange(n) % 5).astype(np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_a_chain_too_long_for_one_launch_runs_fused_in_pieces_bitwise(
    engine: Engine, unfused_engine: Engine, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(5000).astype(np.float32)
    outs = []
    for e in (engine, unfused_engine):
        factors = [1.0 + (i % 7 - 3) / 64 for i in range(1000)]  # their product stays near 1
        blocks = [e.add(Scale(name=f"s{i}", Factor=f, Offset=(i % 5) / 32 - 0.06)) for i, f in enumerate(factors)]
        e.bind(blocks[0], "In", x)
        for a, b in zip(blocks, blocks[1:], strict=False):
            e.connect(a, "Out", b, "In")
        e.update()
        outs.append(e.read(blocks[-1], "Out"))
    fused_nodes = [k for k in engine.graph.plan.kernel_nodes if k.kernel == FUSED_KERNEL]
    assert len(engine.graph.plan.kernel_nodes) == len(fused_nodes) >= 2  # 2,000 scalars: over one launch's 4 KB
    assert np.isfinite(outs[1]).all()
    np.testing.assert_array_equal(outs[0], outs[1])


def test_a_wide_fused_kernel_takes_its_arguments_as_one_buffer_and_hot_and_warm_edits_reach_it(
    engine: Engine, unfused_engine: Engine, rng: np.random.Generator
) -> None:
    """A group with ``BUFFER_FROM_ARGS`` arguments or more hands the driver its storage in one buffer
    (``extra``): the build, a Hot edit of a member mid-chain, a Warm rebind of the input (another CuPy
    array) and a Hot edit after it give the unfused results bit for bit."""
    import cupy as cp

    from cudapatch.engine.params import BUFFER_FROM_ARGS

    x, x2 = (cp.asarray(rng.standard_normal(3000).astype(np.float32)) for _ in range(2))  # device memory: Warm
    chains = []
    for e in (engine, unfused_engine):
        blocks = [e.add(Scale(Factor=1.0 + (i % 5 - 2) / 32, Offset=(i % 3) / 16 - 0.05)) for i in range(20)]
        e.bind(blocks[0], "In", x)
        for a, b in zip(blocks, blocks[1:], strict=False):
            e.connect(a, "Out", b, "In")
        e.keep(blocks[-1], "Out")  # read below: kept from the first build, so no read rebuilds
        e.update()
        chains.append(blocks)
    (node,) = engine.graph.plan.kernel_nodes
    assert node.kernel == FUSED_KERNEL and len(node.args) >= BUFFER_FROM_ARGS
    kp = engine.graph._nodes[node.index].params  # the node's launch struct (no public accessor)
    assert kp.kernelParams == 0 and kp.extra != 0

    def same() -> None:
        for e in (engine, unfused_engine):
            e.update()
        np.testing.assert_array_equal(engine.read(chains[0][-1], "Out"), unfused_engine.read(chains[1][-1], "Out"))

    same()
    rebuilds = engine.counters.rebuilds
    for blocks in chains:
        blocks[7].set("Factor", -1.25)
        blocks[19].set("Offset", 0.375)
    same()
    for e, blocks in zip((engine, unfused_engine), chains, strict=True):
        e.bind(blocks[0], "In", x2)
    same()
    for blocks in chains:
        blocks[0].set("Offset", 2.0)
    same()
    assert (
        engine.counters.rebuilds == rebuilds and engine.counters.hot_updates >= 3 and engine.counters.warm_updates >= 1
    )


_GAIN_CU = """extern "C" __global__ void gain(const float* In, float* Out, float Gain, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Out[i] = In[i] * Gain;
}"""


def test_a_plugin_whose_declaration_does_not_fit_runs_unfused_with_a_warning(
    engine: Engine, rng: np.random.Generator
) -> None:
    from cudapatch import Block, CudaSource
    from cudapatch.blocks.description import like

    class PluginGain(Block):
        type_name = "PluginGain"

        def describe(self, b) -> None:
            k = b.add_kernel(CudaSource(code=_GAIN_CU, name="gain.cu"))
            b.input("In", k.in_(0))
            b.output("Out", k.out(1), size=like("In"))
            b.scalar("Gain", k.in_(2), default=2.0)
            k.auto_grid(like("In"), count_param=3)
            k.elementwise("In * Nope")  # no port or scalar named Nope

    e = engine
    x = rng.standard_normal(4096).astype(np.float32)
    s = e.add(Scale(name="s", Factor=1.5, Offset=0.25))
    g = e.add(PluginGain(name="g", Gain=3.0))
    e.bind(s, "In", x)
    e.connect(s, "Out", g, "In")
    run_until(e, lambda: g.debug.state is BlockState.WARNING)
    assert all(n.kernel != FUSED_KERNEL for n in e.graph.plan.kernel_nodes)
    (warn,) = [d for d in e.diagnostics(g) if d.code == "expression-declaration"]
    assert warn.severity == "warning" and "block 'g' runs unfused" in warn.message
    assert "k.elementwise('In * Nope')" in warn.message and "(column 6)" in warn.message
    e.update()
    ref = (x.astype(np.float64) * 1.5 + 0.25).astype(np.float32) * np.float32(3.0)  # fma, then the plugin's multiply
    np.testing.assert_array_equal(e.read(g, "Out"), ref)
