"""``Context.snapshot`` freezes again only the blocks thawed since the last one (a value, name or
description changed, or the block is new): over random edits it equals every block frozen afresh,
and a quiet patch makes no new block snapshot."""

from __future__ import annotations

import random

import pytest

from cudapatch import CudapatchError, Fill, Scale, VectorAdd
from cudapatch.engine import Context
from cudapatch.engine import context as context_module
from cudapatch.engine.context import BlockSnapshot


def _afresh(c: Context) -> tuple:
    return tuple(
        BlockSnapshot(b.id, b.name, b.description, {k: p.value for k, p in b.params.items()}, c.id) for b in c.registry
    )


@pytest.mark.parametrize("seed", range(10))
def test_a_snapshot_equals_every_block_frozen_afresh_over_random_edits(seed: int) -> None:
    rng = random.Random(seed)
    c = Context()
    blocks = [c.register_block(Fill(name="f", Count=64))]
    for step in range(120):
        kind = rng.choice(["add", "add", "remove", "value", "value", "rename", "describe", "link", "none"])
        if kind == "add" or len(blocks) < 2:
            b = c.register_block(rng.choice([Scale, VectorAdd])(name=f"b{step}"))
            if rng.random() < 0.7:
                c.connect(blocks[-1], blocks[-1].description.outputs[0].name, b, "In" if isinstance(b, Scale) else "A")
            blocks.append(b)
        elif kind == "remove":
            b = blocks.pop(rng.randrange(1, len(blocks)))
            c.unregister_block(b)
        elif kind == "value":
            b = rng.choice(blocks)
            if isinstance(b, Scale):
                b.set("Factor", rng.uniform(0.1, 3.0))
            elif isinstance(b, Fill):
                b.set("Count", rng.randint(1, 512))
        elif kind == "rename":
            rng.choice(blocks).name = f"r{step}"
        elif kind == "describe":  # another description object (an edited kernel), assigned directly
            b = rng.choice(blocks)
            b.description = type(b)(name="template").description
        elif kind == "link":
            a, b = rng.sample(blocks, 2)
            if isinstance(b, Scale) and a.id != b.id:
                try:
                    c.connect(a, a.description.outputs[0].name, b, "In")
                except CudapatchError:  # a cycle or a taken input: not this test's business
                    pass
        snap = c.snapshot()
        assert snap.blocks == _afresh(c), (seed, step, kind)


def test_a_quiet_patch_freezes_no_block_again_and_a_value_change_only_its_block(monkeypatch) -> None:
    c = Context()
    prev = c.register_block(Fill(name="f", Count=64))
    chain = [prev]
    for i in range(50):
        b = c.register_block(Scale(name=f"s{i}"))
        c.connect(prev, "Out", b, "In")
        chain.append(b)
        prev = b
    first = c.snapshot()
    made: list[int] = []
    real = context_module.BlockSnapshot

    def counting(*a, **kw):
        made.append(a[0])
        return real(*a, **kw)

    monkeypatch.setattr(context_module, "BlockSnapshot", counting)
    again = c.snapshot()
    assert made == [] and all(x is y for x, y in zip(again.blocks, first.blocks, strict=True))
    chain[7].set("Factor", 2.0)
    chain[9].name = "renamed"
    snap = c.snapshot()
    assert sorted(made) == sorted([chain[7].id, chain[9].id])
    assert snap.blocks[7 + 0].values["Factor"] == 2.0 and snap.blocks[9].name == "renamed"
