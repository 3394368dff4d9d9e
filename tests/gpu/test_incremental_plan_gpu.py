"""Incremental planning on a real GPU: structure edits of a long chain, built on the build thread from
plans resumed from the last one (``compiler/resume.py``; the equality of resumed and full plans is
unit-tested: tests/unit/test_plan_reuse.py), compute what the chain computes; bypass toggles after
them decide from the resumed ``BypassIndex``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from cudapatch import Engine, Scale

pytestmark = pytest.mark.gpu


@pytest.fixture
def live(tmp_path) -> Iterator[Engine]:
    # Unfused, as bench_liveness.py runs: a chain of Scale blocks would fuse into groups, planned whole.
    e = Engine(cache_dir=tmp_path / "kernel-cache", fuse=False)
    try:
        yield e
    finally:
        e.close()


def until_built(e: Engine, timeout: float = 120.0) -> None:
    """Run frames until the edits made so far are built and swapped in (also the fused test's)."""
    # A frame first: a bypass is only marked until the update that applies it, which starts a build when
    # the block's values share buffers (the build pins them); nothing says "building" before that frame.
    deadline = time.monotonic() + timeout
    e.update()
    while e.building or e.context.dirty.any or e.kernels.pending or e.graph is None:
        assert time.monotonic() < deadline, "the build never landed"
        e.update()
        time.sleep(0.002)


def _expect(e: Engine, block: Scale, x: np.ndarray, factors: list[float]) -> None:
    until_built(e)
    e.output(block, "Out").fill_bytes(0xFF)  # poison: the next frame must write every element
    e.update()
    want = x.astype(np.float64) * float(np.prod(np.array(factors, dtype=np.float64)))
    np.testing.assert_allclose(e.read(block, "Out"), want, rtol=2e-5)


def _off(e: Engine, block: Scale) -> bool:
    """Whether ``block``'s nodes are turned off in the running graph."""
    g = e.graph
    return g is not None and set(g.plan.block_nodes[block.id]) <= g.bypass.disabled


def test_structure_edits_of_a_long_chain_compute_what_the_chain_computes(
    live: Engine, rng: np.random.Generator
) -> None:
    e = live
    x = rng.standard_normal(4099).astype(np.float32)
    factors = [float(f) for f in rng.uniform(0.98, 1.02, 150)]
    blocks = [e.add(Scale(name=f"s{i}", Factor=f)) for i, f in enumerate(factors)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        e.connect(a, "Out", b, "In")
    e.bind(blocks[0], "In", x)
    _expect(e, blocks[-1], x, factors)
    plans = e._builds._plans  # the engine's NodeCache: the builds below resume from the last plan
    resumed = plans.resumed

    tail = e.add(Scale(name="tail", Factor=1.25))  # add a block at the end
    e.connect(blocks[-1], "Out", tail, "In")
    _expect(e, tail, x, [*factors, 1.25])
    e.disconnect(blocks[-1], "Out", tail, "In")  # the tail stops running; the chain still computes
    _expect(e, blocks[-1], x, factors)
    e.connect(blocks[-1], "Out", tail, "In")
    _expect(e, tail, x, [*factors, 1.25])
    blocks[75].set("Factor", 0.5)  # a Hot value and a structure edit in one build
    factors[75] = 0.5
    second = e.add(Scale(name="second", Factor=2.0))
    e.connect(tail, "Out", second, "In")
    _expect(e, second, x, [*factors, 1.25, 2.0])
    e.remove(second)
    _expect(e, tail, x, [*factors, 1.25])
    assert plans.resumed > resumed and plans.resumed_blocks >= 150

    # Its values share buffers (buffer reuse): the first bypass is a build that pins them, then its readers
    # read its input and the factor drops out.
    blocks[40].enabled = False
    _expect(e, tail, x, [*factors[:40], *factors[41:], 1.25])
    assert _off(e, blocks[40])
    blocks[40].enabled, blocks[90].enabled = True, False
    _expect(e, tail, x, [*factors[:90], *factors[91:], 1.25])
    assert _off(e, blocks[90]) and not _off(e, blocks[40])
    blocks[90].enabled = True
    _expect(e, tail, x, [*factors, 1.25])
    assert not e.graph.bypass.disabled
