"""The zero-map ring's ordering rules, as pure functions: CUDA never writes the buffer GL draws or a
buffer whose previous copy is still pending, and GL draws the newest completed copy."""

from __future__ import annotations

import random

from cudapatch.interop.imported import newest_written, next_write_slot, request_slot


def test_writes_skip_the_drawn_and_busy_buffers_and_drop_when_all_are_busy():
    assert next_write_slot(0, 3, -1, lambda k: True) == 1
    assert next_write_slot(1, 3, 2, lambda k: True) == 0  # slot 2 is drawn: the next free one
    assert next_write_slot(1, 3, 0, lambda k: k != 2) == 1  # 2 busy, 0 drawn
    assert next_write_slot(1, 3, 0, lambda k: False) is None  # drop the frame


def test_draws_the_newest_completed_copy_else_keeps_the_old_one():
    assert newest_written([-1, -1, -1], lambda k: True, -1) == -1
    assert newest_written([5, 6, 4], lambda k: True, 2) == 1
    assert newest_written([5, 6, 4], lambda k: k != 1, 2) == 0  # 6 still copying: show 5
    assert newest_written([5, 6, 4], lambda k: False, 2) == 2  # nothing new: keep drawing slot 2


def test_a_random_schedule_never_writes_what_gl_draws_or_shows_a_pending_copy():
    rng = random.Random(1234)
    written, pending, front, frame = [-1, -1, -1], [False] * 3, -1, 0
    gl_busy = [False] * 3
    for _ in range(5000):
        slot = next_write_slot(frame, 3, front, lambda k: not gl_busy[k] and not pending[k])
        if slot is not None:
            assert slot != front and not pending[slot] and not gl_busy[slot]
            frame += 1
            written[slot], pending[slot] = frame, True
        for k in range(3):  # the GPU finishes some copies and some draws
            if pending[k] and rng.random() < 0.5:
                pending[k] = False
            if gl_busy[k] and rng.random() < 0.5:
                gl_busy[k] = False
        new_front = newest_written(written, lambda k: not pending[k], front)
        assert new_front == -1 or not pending[new_front] or new_front == front
        if new_front >= 0:
            front = new_front
            gl_busy[front] = True  # GL draws it (fenced)


def test_a_graph_fed_ring_requests_a_finished_buffer_gl_does_not_draw():
    idle, none = [False] * 3, [0] * 3
    assert request_slot([-1, -1, -1], 0, -1, idle, none) == 0  # nothing written yet
    assert request_slot([0, 1, 2], 3, 2, idle, none) == 0  # slot 2 is drawn
    assert request_slot([0, 1, 2], 2, 0, idle, none) == 1  # slot 2's copy is still pending
    assert request_slot([0, 1, 2], 1, 0, idle, none) == -1  # every other copy pending: drop
    # GL marks: a slot GL is known to be done with wins; else the oldest mark is asked about
    assert request_slot([0, 1, 2], 3, 0, [False, True, False], none) == 2
    assert request_slot([0, 1, 2], 3, 0, [False, True, True], [0, 7, 5]) == 2
    assert request_slot([0, 1, 2], 3, 1, [True, False, True], [4, 0, 5]) == 0
