"""The memory phase: which buffer holds each value the sizes phase found.

The sizes phase records each value as the ``BufferPlan`` it would need on its own, numbered in the
order values are made. Today every value gets exactly that buffer (buffer index = value index);
an append output's data also gets an append counter. A ``through`` output makes no value: it
names the buffer of the value it carries.

This is the room where liveness analysis grows: values whose lifetimes do not overlap may share
one buffer; values read by the host, GL, a delay or a probe stay their own.
"""

from __future__ import annotations

from .draft import PlanDraft

__all__ = ["memory"]


def memory(draft: PlanDraft) -> None:
    """Fill ``draft.buffers``, ``value_buffer``, ``counters``, ``value_counter``, ``outputs`` and ``appends``."""
    counters, appends, value_counter = draft.counters, draft.appends, draft.value_counter
    values = draft.values
    draft.buffers = values  # one buffer per value: the records sizes made are the buffers
    for v in values:
        if v.append:
            key = (v.block_id, v.label)
            ci = len(counters)
            counters.append(key)
            appends[key] = (v.index, ci)
            value_counter[v.index] = ci
    value_buffer = draft.value_buffer = list(range(len(values)))
    draft.outputs = {port: value_buffer[vi] for port, vi in draft.ports.items()}
