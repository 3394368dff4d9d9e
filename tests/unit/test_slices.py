"""``slices``: copies of big dicts and sets made a slice at a time are the copies one C call makes."""

from __future__ import annotations

from itertools import islice

from cudapatch.engine.slices import SLICE, dict_copy, list_of, set_of


def test_a_dict_copy_in_slices_is_the_whole_copy_or_its_first_items_in_order() -> None:
    d = {(i, "Out"): i * 3 for i in range(3 * SLICE + 7)}
    for k in (5, 10):
        del d[(k, "Out")]  # (a dict with holes, as the plan's are)
    full = dict_copy(d)
    assert full == d and list(full) == list(d) and full is not d
    for n in (0, 1, SLICE, SLICE + 1, 2 * SLICE, len(d), len(d) + 9):
        part = dict_copy(d, n)
        assert list(part.items()) == list(islice(d.items(), n))
    small = {1: 2}
    assert dict_copy(small) == small and dict_copy(small) is not small and dict_copy(small, 0) == {}


def test_a_set_in_slices_has_every_item_even_when_items_repeat() -> None:
    items = [i % (SLICE // 2) for i in range(3 * SLICE)] + list(range(SLICE, 2 * SLICE + 3))
    assert set_of(items) == set(items)
    assert set_of(iter(range(SLICE))) == set(range(SLICE)) and set_of(()) == set()


def test_a_list_in_slices_has_every_part_in_order() -> None:
    a, b = list(range(2 * SLICE + 3)), {i: i for i in range(SLICE)}
    assert list_of(a, b.values()) == [*a, *b.values()] and list_of() == [] and list_of((), [1]) == [1]
