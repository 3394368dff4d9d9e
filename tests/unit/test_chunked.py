"""Snapshots of big ordered collections (``engine/chunked.py``): the frozen view follows a dict's
order through random edits, copies only the chunks an edit touched, and behaves as a tuple."""

from __future__ import annotations

import pickle
import random

import pytest

from cudapatch import Fill, Scale
from cudapatch.engine import Context
from cudapatch.engine.chunked import CHUNK, Chunked, ChunkedOrder
from cudapatch.engine.connections import ConnectionGraph, Link


@pytest.mark.parametrize("seed", range(5))
def test_the_frozen_view_follows_a_dicts_order_through_random_edits(seed: int) -> None:
    rng = random.Random(seed)
    values: dict[int, tuple[int, int]] = {}
    order = ChunkedOrder()
    for step in range(3000):
        key = rng.randrange(2 * CHUNK)
        op = rng.random()
        if op < 0.5:  # a new key goes last, a present one changes in place
            values[key] = (key, step)
            order.append(key)
        elif op < 0.75 and key in values:
            del values[key]
            order.discard(key)
        elif key in values:
            values[key] = (key, step)
            order.touch(key)
        if step % 97 == 0:
            assert list(order.freeze(values.__getitem__)) == list(values.values())
    assert order.freeze(values.__getitem__) == tuple(values.values()) and len(order) == len(values)


def test_a_freeze_after_one_change_copies_that_chunk_only() -> None:
    values = {k: f"v{k}" for k in range(5 * CHUNK)}
    order = ChunkedOrder()
    for k in values:
        order.append(k)
    looked: list[int] = []

    def lookup(k: int) -> str:
        looked.append(k)
        return values[k]

    first = order.freeze(lookup)
    assert len(looked) == 5 * CHUNK
    looked.clear()
    values[3 * CHUNK + 7] = "changed"
    order.touch(3 * CHUNK + 7)
    second = order.freeze(lookup)
    assert sorted(looked) == list(range(3 * CHUNK, 4 * CHUNK))  # one chunk looked up again
    assert second[3 * CHUNK + 7] == "changed" and first[3 * CHUNK + 7] == f"v{3 * CHUNK + 7}"  # the first unchanged
    assert all(a is b for i, (a, b) in enumerate(zip(first._chunks, second._chunks, strict=True)) if i != 3)


def test_chunked_behaves_as_a_tuple() -> None:
    c = Chunked(((1, 2), (3,), (4, 5, 6)))
    t = (1, 2, 3, 4, 5, 6)
    assert c == t and c == list(t) and c == Chunked((t,)) and c != (1, 2, 3) and len(c) == 6
    assert tuple(c) == t and c[4] == 5 and c[-1] == 6 and c[1:4] == (2, 3, 4)
    assert c + (7,) == t + (7,) and (0,) + c == (0,) + t
    assert pickle.loads(pickle.dumps(c)) == t
    with pytest.raises(TypeError):
        hash(c)


def _naive_reaches(links: list[Link], start: int, target: int) -> bool:
    seen, stack = set(), [start]
    while stack:
        b = stack.pop()
        if b == target:
            return True
        if b not in seen:
            seen.add(b)
            stack.extend(lk.dst for lk in links if lk.src == b)
    return False


@pytest.mark.parametrize("seed", range(4))
def test_connections_agree_with_a_plain_dict_through_random_edits(seed: int) -> None:
    rng = random.Random(seed)
    g = ConnectionGraph()
    ref: dict[tuple[int, str], Link] = {}
    for _ in range(1500):
        op = rng.random()
        if op < 0.6:
            lk = Link(rng.randrange(40), "Out", rng.randrange(40), rng.choice("ab"))
            assert g.add(lk) == ref.get((lk.dst, lk.dst_port))
            ref[(lk.dst, lk.dst_port)] = lk
        elif op < 0.8 and ref:
            lk = rng.choice(list(ref.values()))
            assert g.remove(lk)
            del ref[(lk.dst, lk.dst_port)]
        else:
            b = rng.randrange(40)
            gone = g.remove_block(b)
            want = [lk for lk in ref.values() if b in (lk.src, lk.dst)]
            assert sorted(gone, key=repr) == sorted(want, key=repr)
            for lk in want:
                del ref[(lk.dst, lk.dst_port)]
        assert g.links() == tuple(ref.values()) and len(g) == len(ref)
    links = list(ref.values())
    for b in range(40):
        assert sorted(g.links_from(b), key=repr) == sorted((lk for lk in links if lk.src == b), key=repr)
        assert sorted(g.links_of(b), key=repr) == sorted((lk for lk in links if b in (lk.src, lk.dst)), key=repr)
    for _ in range(200):
        s, t = rng.randrange(40), rng.randrange(40)
        assert g.reaches(s, t) == _naive_reaches(links, s, t)


def test_a_snapshot_after_one_hot_edit_shares_every_other_chunk() -> None:
    c = Context()
    blocks = [c.register_block(Fill(name="fill", Count=64))]
    for i in range(3 * CHUNK):
        blocks.append(c.register_block(Scale(name=f"s{i}")))
        c.connect(blocks[-2], "Out", blocks[-1], "In")
    first = c.snapshot()
    blocks[CHUNK + 3].set("Factor", 2.5)
    second = c.snapshot()
    assert [b.id for b in second.blocks] == [b.id for b in blocks]
    pairs = zip(first.blocks._chunks, second.blocks._chunks, strict=True)
    assert [i for i, (a, b) in enumerate(pairs) if a is not b] == [1]  # the chunk holding that block
    assert second.blocks[CHUNK + 3].values["Factor"] == 2.5 and first.blocks[CHUNK + 3].values["Factor"] == 1.0
    assert first.links._chunks == second.links._chunks  # no link changed


def test_chunks_emptied_by_removals_are_filled_again() -> None:
    values = {k: k for k in range(20 * CHUNK)}
    order = ChunkedOrder()
    for k in values:
        order.append(k)
    for k in [k for k in values if k % 10]:  # nine in ten go, from every chunk
        del values[k]
        order.discard(k)
    frozen = order.freeze(values.__getitem__)
    assert frozen == tuple(values.values())
    assert len(frozen._chunks) <= 4 * len(values) // CHUNK + 4  # not 20 chunks of a tenth each
