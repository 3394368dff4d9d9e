"""The memory phase: which buffer holds each value the sizes phase found.

Today every value gets a buffer of its own (the buffer index is the value's index), sized by its
count; an append output's data also gets an append counter. A ``through`` output makes no value:
it names the buffer of the value it carries.

This is the room where liveness analysis grows: values whose lifetimes do not overlap may share
one buffer; values read by the host, GL, a delay or a probe stay their own.
"""

from __future__ import annotations

from ..plan import BufferPlan
from .draft import PlanDraft

__all__ = ["memory"]

_new = tuple.__new__  # skips NamedTuple.__new__: several times cheaper (see plan.py)


def memory(draft: PlanDraft) -> None:
    """Fill ``draft.buffers``, ``value_buffer``, ``counters``, ``value_counter``, ``outputs`` and ``appends``."""
    buffers, counters, appends, value_counter = draft.buffers, draft.counters, draft.appends, draft.value_counter
    for vi, v in enumerate(draft.values):  # one buffer per value, in the order they were made
        buffers.append(_new(BufferPlan, (vi, *v)))
        if v.append:
            key = (v.block_id, v.label)
            ci = len(counters)
            counters.append(key)
            appends[key] = (vi, ci)
            value_counter[vi] = ci
    value_buffer = draft.value_buffer = list(range(len(buffers)))
    draft.outputs = {port: value_buffer[vi] for port, vi in draft.ports.items()}
