"""The particle blocks at plan level: one persistent state buffer flows through ``through`` ports,
kernels are ordered by in-place writes, sizes derive from the Emitter's capacity."""

from __future__ import annotations

import pytest

from cudapatch import Block, BlockBuilder, CudapatchError, compile_plan
from cudapatch.blocks.library import Emitter, Forces, Integrate, ToPoints, particle_capacity
from cudapatch.engine import Context, KernelNodePlan
from cudapatch.kernels.cuda_source import CudaSource


def _chain(capacity: int = 1000):
    c = Context()
    e, f, i, t = (c.register_block(cls()) for cls in (Emitter, Forces, Integrate, ToPoints))
    e.set("Capacity", capacity)
    c.connect(e, "Particles", f, "Particles")
    c.connect(f, "Particles", i, "Particles")
    c.connect(i, "Particles", t, "Particles")
    return c, e, f, i, t


def test_state_buffer_flows_through_and_orders_the_chain():
    c, e, f, i, t = _chain(1000)
    plan = compile_plan(c.snapshot())
    state = plan.outputs[(e.id, "Particles")]
    assert plan.outputs[(f.id, "Particles")] == state and plan.outputs[(i.id, "Particles")] == state
    assert plan.buffers[state].count == 4 * 1000 + 2
    assert particle_capacity(plan.buffers[state].count) == 1000
    assert plan.buffers[plan.outputs[(t.id, "Points")]].count == 2 * 1000
    assert len(plan.buffers) == 2  # the state and the points: through ports allocate nothing
    begin, emit = (plan.nodes[n] for n in plan.block_nodes[e.id])
    (forces,) = (plan.nodes[n] for n in plan.block_nodes[f.id])
    (integ,) = (plan.nodes[n] for n in plan.block_nodes[i.id])
    (points,) = (plan.nodes[n] for n in plan.block_nodes[t.id])
    assert begin.index in emit.deps and emit.index in forces.deps
    assert forces.index in integ.deps and integ.index in points.deps
    assert begin.grid == 1  # one thread starts the frame
    assert emit.grid == -(-(1 << 16) // emit.block) and forces.grid == -(-1000 // forces.block)
    assert all(isinstance(n, KernelNodePlan) for n in (begin, emit, forces, integ, points))
    # the capacity parameter of every kernel is the Emitter's
    assert forces.args[1].value == integ.args[1].value == points.args[2].value == 1000


def test_a_second_reader_of_the_state_waits_for_the_in_place_writers():
    c, e, f, i, t = _chain(64)
    t2 = c.register_block(ToPoints(name="direct"))
    c.connect(e, "Particles", t2, "Particles")  # reads the Emitter's output, which Forces modifies
    plan = compile_plan(c.snapshot())
    (forces,) = plan.block_nodes[f.id]
    (direct,) = plan.block_nodes[t2.id]

    def after(a: int, b: int) -> bool:  # does node a (transitively) wait for node b?
        todo, seen = [a], set()
        while todo:
            x = todo.pop()
            for dep in plan.nodes[x].deps:
                if dep == b:
                    return True
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return False

    assert after(direct, forces) or after(forces, direct)  # ordered one way or the other, never concurrent


def test_capacity_is_structural_and_hot_scalars_are_not():
    e = Emitter()
    assert e.description.param("Capacity").structural
    assert not e.description.param("Rate").structural
    assert e.description.param("Origin").default == (0.0, -0.5, 0.0)


def test_through_needs_an_input_of_that_name_written_in_place():
    code = 'extern "C" __global__ void k(const float* a, float* b, unsigned n) {}'

    class NoInput(Block):
        type_name = "NoInput"

        def describe(self, b: BlockBuilder) -> None:
            k = b.add_kernel(CudaSource(code=code))
            b.input("A", k.in_(0))
            b.output("B", k.out(1), size=4)
            k.set_count(2, 4)
            b.through("C")

    class ReadOnly(NoInput):
        type_name = "ReadOnly"

        def describe(self, b: BlockBuilder) -> None:
            k = b.add_kernel(CudaSource(code=code))
            b.input("A", k.in_(0))
            b.output("B", k.out(1), size=4)
            k.set_count(2, 4)
            b.through("A")

    with pytest.raises(CudapatchError, match="needs an input called 'C'"):
        _ = NoInput().description
    with pytest.raises(CudapatchError, match="no kernel writes input 'A'"):
        _ = ReadOnly().description


def test_read_particles_decodes_the_state_layout():
    import numpy as np

    from cudapatch.blocks.library import read_particles

    cap, frame, alive = 10, 7, 3  # frame 7: survivors in half (7 & 1) ^ 1 = 0
    rng = np.random.default_rng()
    raw = rng.standard_normal((4 * cap + 2, 4)).astype(np.float32)
    header = raw[:2].view(np.uint32)
    header[0] = (0x43505354, cap, frame, 0)
    header[1, 0], header[1, 1] = alive, 999
    st = read_particles(raw)
    assert (st.capacity, st.frame, st.alive) == (cap, frame, alive)
    assert np.array_equal(st.positions, raw[2 : 2 + alive]) and np.array_equal(
        st.velocities, raw[2 + cap : 2 + cap + alive]
    )
    header[0, 0] = 0
    with pytest.raises(ValueError, match="not a particle state"):
        read_particles(raw)
