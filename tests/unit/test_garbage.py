"""``drop_gradually``: a replaced plan is freed a piece at a time off the frame thread, each piece
small, with a checkpoint between pieces (a frame that starts meanwhile runs first)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from cudapatch.engine import garbage
from cudapatch.engine.garbage import PIECE, drop_gradually


class Node:
    """A small object standing for a plan's node (weakly referenceable: its death is counted)."""

    def __init__(self, i: int) -> None:
        self.i = i
        self.args = (i, i + 1)


@dataclass(frozen=True)
class Plan:
    nodes: tuple[Node, ...]
    by_id: dict[int, Node]
    order: tuple[int, ...]


def _count_frees(monkeypatch, nodes: tuple[object, ...]) -> tuple[list[int], list[weakref.ref]]:  # noqa: ANN001
    """How many of ``nodes`` (any weakly referenceable objects) each piece frees (one entry per
    ``checkpoint()``, filled as they go), and a weak reference to each node."""
    per_piece: list[int] = []
    freed = [0]

    def checkpoint() -> None:
        per_piece.append(freed[0])
        freed[0] = 0

    monkeypatch.setattr(garbage, "checkpoint", checkpoint)
    return per_piece, [weakref.ref(n, lambda _r: freed.__setitem__(0, freed[0] + 1)) for n in nodes]


def test_a_big_plan_is_freed_in_pieces_with_a_checkpoint_between(monkeypatch) -> None:
    nodes = tuple(Node(i) for i in range(20 * PIECE))
    freed_per_piece, refs = _count_frees(monkeypatch, nodes)
    plan = Plan(nodes, {n.i: n for n in nodes}, tuple(range(len(nodes))))
    shown = {"big": list(range(5 * PIECE))}
    trash = [(plan, None, shown)]  # as ``discard_later`` keeps a replaced plan with what came with it
    del nodes, plan, shown
    drop_gradually(trash)
    assert trash == [] and all(r() is None for r in refs)  # everything went
    assert len(freed_per_piece) > 20 and max(freed_per_piece) <= PIECE  # in pieces, none bigger than PIECE


def test_what_someone_else_still_holds_is_left_as_it_is(monkeypatch) -> None:
    monkeypatch.setattr(garbage, "checkpoint", lambda: None)
    nodes = tuple(Node(i) for i in range(3 * PIECE))
    plan = Plan(nodes, {n.i: n for n in nodes}, tuple(range(len(nodes))))
    kept = plan  # the next plan shares it (incremental planning)
    drop_gradually([plan])
    assert kept.nodes is nodes and len(kept.by_id) == 3 * PIECE and kept.order[-1] == 3 * PIECE - 1


class Graph:
    """Stands for a retired ``CompiledGraph``: it holds its plan beside node objects of its own."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._nodes = [object() for _ in plan.nodes]
        self.closed = True


def test_the_plan_a_retired_graph_holds_is_freed_in_pieces_too(monkeypatch) -> None:
    nodes = tuple(Node(i) for i in range(20 * PIECE))
    freed_per_piece, refs = _count_frees(monkeypatch, nodes)
    idle = [Graph(Plan(nodes, {n.i: n for n in nodes}, tuple(range(len(nodes)))))]  # as ``take_idle`` hands them
    del nodes
    drop_gradually(idle)
    assert idle == [] and all(r() is None for r in refs)
    assert max(freed_per_piece) <= PIECE  # the plan's nodes too, not all at once with the plan


def test_a_drop_told_to_stop_returns_the_rest_which_frees_everything_later(monkeypatch) -> None:
    nodes = [Node(i) for i in range(20 * PIECE)]
    freed_per_piece, refs = _count_frees(monkeypatch, tuple(nodes))
    trash = [nodes]  # a big list of nodes nothing else holds: each piece frees PIECE of them
    del nodes
    stops: list[int] = []

    def stop() -> bool:  # a build waits twice, each time after pieces that freed nodes, then never again
        done = sum(freed_per_piece)
        if len(stops) < 2 and done > (stops[-1] if stops else 0):
            stops.append(done)
            return True
        return False

    rest = drop_gradually(trash, stop)
    assert callable(rest) and trash == []
    alive = sum(r() is not None for r in refs)
    assert 0 < alive < len(refs)  # stopped midway: some freed, the rest still held by ``rest``
    rest = rest()
    assert callable(rest) and 0 < sum(r() is not None for r in refs) < alive  # stopped again, further on
    assert rest() is None and all(r() is None for r in refs)  # and the third call ends it
    assert max(freed_per_piece) <= PIECE


def test_a_big_containers_items_are_listed_in_slices_in_order() -> None:
    from cudapatch.engine.garbage import _items
    from cudapatch.engine.slices import SLICE

    d = {i: str(i) for i in range(2 * SLICE + 5)}
    assert _items(d) == [*d.keys(), *d.values()]
    s = set(range(SLICE))
    assert sorted(_items(s)) == sorted(s) and _items(tuple(range(3))) == [0, 1, 2] and _items({}) == []


class Big(list):
    """A big container (weakly referenceable: its death is counted)."""


@dataclass(frozen=True)
class Tables:
    a: Big
    b: Big
    c: Big
    d: Big


def test_each_big_container_is_released_in_a_piece_of_its_own(monkeypatch) -> None:
    """Releasing a 10,000-item container is 10,000 reference counts even when its items live on: a
    piece holding several of them (a plan's big dicts) was milliseconds of one release."""
    bigs = [Big(Node(i) for i in range(2 * PIECE)) for _ in range(4)]
    per_piece, refs = _count_frees(monkeypatch, tuple(bigs))
    trash = [Tables(*bigs)]
    del bigs
    drop_gradually(trash)
    assert all(r() is None for r in refs) and sum(per_piece) == 4 and max(per_piece) == 1


def test_drop_each_lets_go_of_one_object_at_a_time_last_first() -> None:
    from cudapatch.engine.garbage import drop_each

    nodes = [Node(i) for i in range(5)]
    order: list[int] = []
    for n in nodes:
        weakref.finalize(n, order.append, n.i)
    objects = list(nodes)
    del nodes, n
    drop_each(objects)
    assert objects == [] and order == [4, 3, 2, 1, 0]
