"""Incremental planning of a fused patch on a real GPU: structure edits of a chain that runs as several
fused groups (``compiler/fusion.py``), built on the build thread from plans resumed at the first group
the edit touched (``compiler/resume.py``; resumed and full plans are equal: tests/unit/test_plan_reuse_fused.py),
compute what the chain computes, bit for bit (a fused member rounds its value to a float as a stored
output would be rounded)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from cudapatch import Engine, Scale

from .test_incremental_plan_gpu import until_built

pytestmark = pytest.mark.gpu

N = 1200  # three groups: about 500 Scale blocks fit the arguments of one launch


@pytest.fixture
def live(tmp_path) -> Iterator[Engine]:
    e = Engine(cache_dir=tmp_path / "kernel-cache")  # fuse=True: the engine's default
    try:
        yield e
    finally:
        e.close()


def _chain(x: np.ndarray, factors: list[float]) -> np.ndarray:
    y = x.copy()
    for f in factors:  # Scale: fma(In, Factor, 0), rounded to a float at every block
        y = (y * np.float32(f)).astype(np.float32)
    return y


def _expect(e: Engine, block: Scale, x: np.ndarray, factors: list[float]) -> None:
    until_built(e)
    e.output(block, "Out").fill_bytes(0xFF)  # poison: the next frame must write every element
    e.update()
    np.testing.assert_array_equal(e.read(block, "Out"), _chain(x, factors))


def _groups(e: Engine) -> list[tuple[int, ...]]:
    return [n.source.members for n in e.graph.plan.kernel_nodes if getattr(n.source, "members", ())]


def test_structure_edits_of_a_fused_chain_compute_what_the_chain_computes(
    live: Engine, rng: np.random.Generator
) -> None:
    e = live
    x = rng.standard_normal(4099).astype(np.float32)
    factors = [float(f) for f in rng.uniform(0.999, 1.001, N)]
    blocks = [e.add(Scale(name=f"s{i}", Factor=f)) for i, f in enumerate(factors)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        e.connect(a, "Out", b, "In")
    e.bind(blocks[0], "In", x)
    _expect(e, blocks[-1], x, factors)
    assert len(_groups(e)) >= 2
    e.keep(blocks[-1], "Out", False)  # read above, so kept: let the tail below fuse with it again
    plans = e._builds._plans  # the engine's NodeCache: the builds below resume from the last plan
    resumed, resumed_blocks = plans.resumed, plans.resumed_blocks

    tail = e.add(Scale(name="tail", Factor=1.25))  # a member at the end: the last group grows
    e.connect(blocks[-1], "Out", tail, "In")
    _expect(e, tail, x, [*factors, 1.25])
    assert _groups(e)[-1][-2:] == (blocks[-1].id, tail.id)
    blocks[100].set("Factor", 0.5)  # a Hot value in the first group and a structure edit in one build
    factors[100] = 0.5
    second = e.add(Scale(name="second", Factor=2.0))
    e.connect(tail, "Out", second, "In")
    _expect(e, second, x, [*factors, 1.25, 2.0])
    e.remove(second)
    _expect(e, tail, x, [*factors, 1.25])
    assert plans.resumed - resumed >= 3 and plans.resumed_blocks - resumed_blocks >= 3 * 500

    reader = e.add(Scale(name="reader", Factor=3.0))  # a member read twice: its group splits there
    e.connect(blocks[700], "Out", reader, "In")
    _expect(e, reader, x, [*factors[:701], 3.0])
    assert any(g[-1] == blocks[700].id for g in _groups(e))
    _expect(e, tail, x, [*factors, 1.25])
    e.remove(reader)
    e.remove(blocks[800])  # a member removed inside a group, the chain linked around it
    e.connect(blocks[799], "Out", blocks[801], "In")
    del factors[800]
    _expect(e, tail, x, [*factors, 1.25])

    blocks[900].enabled = False  # a fused member bypassed: a build takes it out of its group, then it is off
    _expect(e, tail, x, [*factors[:899], *factors[900:], 1.25])
    g = e.graph
    assert set(g.plan.block_nodes[blocks[900].id]) <= g.bypass.disabled
    blocks[900].enabled = True
    _expect(e, tail, x, [*factors, 1.25])
