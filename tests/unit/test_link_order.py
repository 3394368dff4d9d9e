"""SameFrameOrder (``engine/link_order.py``): the cycle check of ``Context.connect`` by ranks, beside a
walk of the patch over random edits (no GPU)."""

from __future__ import annotations

import random

import pytest

from cudapatch import FrameDelay, Scale
from cudapatch.engine import Context
from cudapatch.engine.connections import ConnectionGraph, Link
from cudapatch.engine.link_order import SameFrameOrder
from cudapatch.errors import LinkError


def _walk_reaches(links: ConnectionGraph, start: int, target: int, cut: set[tuple[int, str]]) -> bool:
    return links.reaches(start, target, follow=lambda lk: (lk.dst, lk.dst_port) not in cut)


def _climbs(order: SameFrameOrder, links: ConnectionGraph, cut: set[tuple[int, str]]) -> bool:
    rank = order._rank
    return all(rank[lk.src] < rank[lk.dst] for lk in links if (lk.dst, lk.dst_port) not in cut)


def test_admit_says_what_a_walk_says_over_random_links_removals_and_feedback_changes() -> None:
    # Property: for any sequence of links made, removed, blocks removed and inputs turning feedback
    # (read a frame late) or back, ``admit`` refuses exactly the links a walk finds a same-frame
    # cycle for, and while the patch has none, ranks climb along every same-frame link.
    rng = random.Random(20261127)
    for trial in range(60):
        links = ConnectionGraph()
        cut: set[tuple[int, str]] = set()
        order = SameFrameOrder(links, lambda lk, cut=cut: (lk.dst, lk.dst_port) not in cut)
        blocks = list(range(rng.randrange(3, 40)))
        ports = ["a", "b"]
        for _ in range(400):
            step = rng.random()
            if step < 0.6:
                src, dst, port = rng.choice(blocks), rng.choice(blocks), rng.choice(ports)
                if (dst, port) in cut:
                    links.add(Link(src, "Out", dst, port))  # into a feedback input: never a cycle
                    continue
                cycle = src == dst or _walk_reaches(links, dst, src, cut)
                assert order.admit(src, dst) is (not cycle), (trial, src, dst)
                if not cycle:
                    links.add(Link(src, "Out", dst, port))
                    if order._valid and order._acyclic:
                        assert _climbs(order, links, cut)
            elif step < 0.8 and len(links):
                links.remove(rng.choice(list(links)))
            elif step < 0.9:
                key = (rng.choice(blocks), rng.choice(ports))
                cut.symmetric_difference_update({key})  # a re-description: the input is feedback, or no more
                order.invalidate()
            else:
                gone = rng.choice(blocks)
                links.remove_block(gone)
                order.forget(gone)


def test_a_link_into_the_middle_of_a_long_chain_looks_at_a_few_blocks_not_the_chain() -> None:
    c = Context()
    chain = [c.register_block(Scale(name=f"s{i}")) for i in range(2000)]
    for a, b in zip(chain, chain[1:], strict=False):
        c.connect(a, "Out", b, "In")
    looked = []
    links_of = c.connections.links_of
    c.connections.links_of = lambda b: looked.append(b) or links_of(b)  # type: ignore[method-assign]
    # A hot swap of block 1000: removed, made again (ranked last), linked between its neighbours.
    c.unregister_block(chain[1000])
    new = c.register_block(Scale(name="s1000"))
    c.connect(chain[999], "Out", new, "In")
    c.connect(new, "Out", chain[1001], "In")
    assert len(looked) < 20, len(looked)  # (a walk below block 1001 looks at 999 blocks)
    with pytest.raises(LinkError, match="cycle"):  # (found by following the path it closes)
        c.connect(chain[1500], "Out", chain[10], "In")


def test_a_loop_through_a_frame_delay_is_linked_and_one_around_it_is_refused() -> None:
    c = Context()
    a, d, b = (c.register_block(x) for x in (Scale(name="a"), FrameDelay(name="d"), Scale(name="b")))
    c.connect(a, "Out", d, "In")
    c.connect(d, "Out", b, "In")
    c.connect(b, "Out", a, "In")  # a -> d -> b -> a passes through d's In (read a frame late): linked
    assert len(c.connections) == 3
    with pytest.raises(LinkError, match="cycle"):
        c.connect(a, "Out", b, "In")  # a -> b -> a within one frame
    assert c.connections.link_into(b.id, "In") == Link(d.id, "Out", b.id, "In")  # the old link stays


def test_adding_a_frame_delay_to_a_large_patch_ranks_nothing_afresh() -> None:
    # A block just registered has no links: its feedback inputs change no link's kind, so the next
    # connect must not rank every block again (15 ms in a 10,000-block chain on the CPU machine).
    c = Context()
    chain = [c.register_block(Scale(name=f"s{i}")) for i in range(50)]
    for a, b in zip(chain, chain[1:], strict=False):
        c.connect(a, "Out", b, "In")
    afresh = []
    real = c._order._rank_afresh
    c._order._rank_afresh = lambda: afresh.append(1) or real()  # type: ignore[method-assign]
    d = c.register_block(FrameDelay(name="d"))
    c.connect(chain[40], "Out", d, "In")
    c.connect(d, "Out", chain[10], "In")  # through d's In (a frame late): linked
    assert afresh == [] and len(c.connections) == 50  # (d.Out replaced s9 -> s10)
    with pytest.raises(LinkError, match="cycle"):
        c.connect(chain[40], "Out", d, "Init")  # Init is read within the frame
    assert afresh == []
