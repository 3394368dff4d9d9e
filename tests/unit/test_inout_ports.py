"""Inout pointers of kernels whose signature makes the ports (``CustomKernel``, ``KernelFile``): an
in-place port the user binds or links, read and written where it lies, never allocated or zeroed by
the engine (plans compiled without a GPU)."""

from __future__ import annotations

import pytest

from cudapatch import CustomKernel, DType, Fill, KernelFile, compile_plan
from cudapatch.engine import Context, ExternalBinding, KernelNodePlan, MemsetNodePlan
from cudapatch.kernels.source import BUNDLED_KERNEL_DIR

#: An appending kernel as a CustomKernel's Code, its counter marked inout in the signature.
APPEND_CODE = """\
extern "C" __global__ void keep_big(const float* in, float* out, /*inout*/ unsigned int* counter,
                                    float threshold, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && in[i] > threshold) {
        unsigned int slot = atomicAdd(counter, 1u);
        if (slot < n) out[slot] = in[i];
    }
}
"""

COUNTER_PTR = 0x7100_0000


#: The same appending kernel from CUDA C++ and from a VL.CudaGraph PTX + JSON sidecar.
MAKERS = {
    "CustomKernel": lambda: CustomKernel(name="keep", Code=APPEND_CODE),
    "KernelFile-ptx": lambda: KernelFile(BUNDLED_KERNEL_DIR / "append_filter.ptx", name="keep"),
}


def _ctx(*blocks) -> Context:
    c = Context()
    for b in blocks:
        c.register_block(b)
    return c


def _node(plan, block) -> KernelNodePlan:
    (ni,) = plan.block_nodes[block.id]
    node = plan.nodes[ni]
    assert isinstance(node, KernelNodePlan)
    return node


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_an_inout_pointer_is_a_required_input_passed_on_in_place(make):
    block = make()
    d = block.description
    counter = d.input("counter")
    assert counter is not None and counter.required and counter.dtype == DType.UINT32
    out = {p.name: p for p in d.outputs}
    assert out["counter"].kind == "through"  # the same buffer flows on: no new one
    assert out["out"].kind == "buffer"  # the data is an ordinary output, as many elements as "in"
    assert [p.name for p in d.inputs] == ["in", "counter"]


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_an_unbound_inout_pointer_keeps_the_block_out_naming_the_port(make):
    block = make()
    f = Fill(name="f", Count=500, Value=2.0)
    c = _ctx(f, block)
    c.connect(f, "Out", block, "in")
    plan = compile_plan(c.snapshot())
    assert plan.skipped == (block.id,) and block.id not in plan.block_nodes
    (diag,) = [d for d in plan.diagnostics if d.block_id == block.id]
    assert diag.code == "input-unlinked" and "'counter'" in diag.message and "keep" in diag.message


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_a_bound_inout_pointer_is_read_and_written_in_place(make):
    block = make()
    f = Fill(name="f", Count=500, Value=2.0)
    c = _ctx(f, block)
    c.connect(f, "Out", block, "in")
    c.bind_input(block, "counter", ExternalBinding(COUNTER_PTR, 1, DType.UINT32))
    plan = compile_plan(c.snapshot())
    assert not plan.skipped and not plan.diagnostics
    node = _node(plan, block)
    arg = node.args[block.description.kernels[0].descriptor.param_index("counter")]
    # the user's memory itself, a slot a rebind patches: no planned buffer, no engine counter, no memset
    assert arg.kind == "external" and arg.ref == (block.id, "counter")
    assert plan.binding_slots[(block.id, "counter")] == ((node.index, node.args.index(arg)),)
    assert not plan.counters and not plan.appends
    assert not any(isinstance(n, MemsetNodePlan) for n in plan.nodes)
    assert {b.label for b in plan.buffers if b.block_id == block.id} == {"out"}
    assert (block.id, "counter") not in plan.outputs
    assert plan.buffers[plan.outputs[(block.id, "out")]].count == 500


def test_a_linked_inout_pointer_is_written_in_the_linked_buffer_and_read_after():
    """A counter made by another block, linked in: the kernel writes that block's buffer, and a block
    reading the in-place output waits for the kernel (read after write), not for a copy."""
    block = CustomKernel(name="keep", Code=APPEND_CODE)
    src = Fill(name="src", Count=700, Value=3.0)
    zero = CustomKernel(
        name="zero",
        Code='extern "C" __global__ void zero(unsigned int* c, unsigned int n) { c[0] = 0u; }',
    )
    after = CustomKernel(
        name="after",
        Code='extern "C" __global__ void after(const unsigned int* c, float* Seen) { Seen[0] = (float)c[0]; }',
    )
    c = _ctx(src, zero, block, after)
    c.connect(src, "Out", block, "in")
    c.connect(zero, "c", block, "counter")
    c.connect(block, "counter", after, "c")
    plan = compile_plan(c.snapshot())
    assert not plan.skipped, plan.diagnostics
    zero_buf = plan.outputs[(zero.id, "c")]
    nk, na, nz = _node(plan, block), _node(plan, after), _node(plan, zero)
    counter_i = block.description.kernels[0].descriptor.param_index("counter")
    assert nk.args[counter_i].kind == "buffer" and nk.args[counter_i].ref == zero_buf
    assert na.args[0].ref == zero_buf  # the same buffer, after the kernel wrote it
    assert nz.index in nk.deps and nk.index in na.deps
    # no buffer of its own for the counter: the planned ones are the blocks' plain outputs
    assert sorted((plan.buffers[i].block_id, plan.buffers[i].label) for i in range(len(plan.buffers))) == sorted(
        [(src.id, "Out"), (zero.id, "c"), (block.id, "out"), (after.id, "Seen")]
    )


def test_a_kernel_with_only_inout_pointers_launches_over_its_first_inout_input():
    """``n`` is the length of the memory written in place (never the ``Count`` default, which would
    run a 1024-thread launch past a shorter buffer into whatever lies after it)."""
    add = CustomKernel(
        name="add",
        Code='extern "C" __global__ void add(/*inout*/ float* x, float step, unsigned int n) { }',
    )
    assert "Count" not in {p.name for p in add.description.params}
    src = Fill(name="src", Count=300, Value=0.0)
    c = _ctx(src, add)
    c.connect(src, "Out", add, "x")
    plan = compile_plan(c.snapshot())
    node = _node(plan, add)
    assert node.args[2].kind == "const" and node.args[2].value == 300
    assert node.grid * node.block >= 300 and (node.grid - 1) * node.block < 300
