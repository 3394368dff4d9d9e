"""What a frame says about its regions (no GPU): iterations from the readback ring by counter
index, the Max warning of a While, and ``Iterations: n/limit`` in a loop's tooltip."""

from __future__ import annotations

from types import SimpleNamespace

from cudapatch import Fill, For, Scale, While
from cudapatch.engine import Context, compile_plan
from cudapatch.engine.region_stats import region_iterations, region_warnings, show_iterations


class _Ring:
    def __init__(self, values: dict[int, int]) -> None:
        self.values = values

    def value(self, index: int) -> int | None:
        return self.values.get(index)


def test_iterations_warnings_and_tooltips_come_from_the_ring() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=16))
    f = c.register_block(For(name="Steps", Count=3))
    a = c.register_block(Scale(name="A"))
    c.place(a, f)
    c.connect(src, "Out", a, "In")
    plan = compile_plan(c.snapshot())
    ci = plan.regions[f.id].counter
    graph = SimpleNamespace(plan=plan, readback=_Ring({ci: 3}))
    assert region_iterations(graph, f.id) == 3 and region_iterations(graph, src.id) is None
    assert region_iterations(SimpleNamespace(plan=plan, readback=None), f.id) is None
    assert region_warnings(graph, c.registry) == ()  # a For never warns: it runs its Count
    show_iterations(graph, c.registry)
    assert f.debug.append_fill == {"Iterations": (3, 3)} and "Iterations: 3/3" in str(f)


def test_a_while_that_ran_max_iterations_warns() -> None:
    from cudapatch import CustomKernel

    check = """extern "C" __global__ void check(const float* in, int* more, float level, unsigned int n) { }"""
    c = Context()
    src = c.register_block(Fill(name="Src", Count=16))
    w = c.register_block(While(name="Solve", Max=8))
    chk = c.register_block(CustomKernel(name="Check", Code=check))
    c.place(chk, w)
    c.connect(src, "Out", chk, "in")
    c.connect(chk, "more", w, "Condition")
    plan = compile_plan(c.snapshot())
    ci = plan.regions[w.id].counter
    (warn,) = region_warnings(SimpleNamespace(plan=plan, readback=_Ring({ci: 8})), c.registry)
    assert warn.block_id == w.id and warn.code == "region-max" and "Max (8 iterations)" in warn.message
    assert region_warnings(SimpleNamespace(plan=plan, readback=_Ring({ci: 5})), c.registry) == ()
