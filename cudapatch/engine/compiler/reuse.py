"""NodeCache: the nodes phase reuses the node drafts of blocks an edit did not touch.

The nodes phase is most of a plan's cost (11-20 ms of 20-40 at 1,000 blocks on the CPU machine):
every argument of every kernel is resolved again for every structure edit. A block's drafts depend
only on what ``_work_node`` reads: the block's snapshot (description and parameter values: the
Context keeps one snapshot object per block while neither changes, so identity says it), where its
inputs come from, the buffers and counters that hold the values it reads and makes, and the index
of its first node. When all of that equals what the last plan saw, its drafts are taken as they
were and the slots Hot and Warm edits patch are recorded again from their arguments; else they are
made anew. An edit at the end of a chain re-plans one block; an edit in the middle re-plans the
blocks after it (their node indices moved). Plans with and without the cache are equal
(``tests/unit/test_plan_reuse.py``, over random edit sequences). Measured on the CPU machine, a
1,000-block chain with one block added at its end: the nodes phase 9.8 -> 6.7 ms of CPU time,
``compile_plan`` 17.7 -> 13.4 ms. Since then ``resume.py`` takes the plan parts of every block before
the first one an edit touched from the last plan, in every phase from sizes to buffer sharing (the
cache carries its state); this cache still serves the blocks after it.

Used by one build at a time (the engine builds one at a time, on whichever thread).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from .draft import BlockSizes, NodeDraft

__all__ = ["NodeCache"]


class _Entry(NamedTuple):
    snapshot: Any  # the BlockSnapshot the drafts were made from (compared by identity)
    first: int  # index of the block's first node
    signature: tuple  # its inputs, outputs and internal values with the buffers holding them
    drafts: tuple[NodeDraft, ...]


def signature(sized: BlockSizes, value_buffer: list[int], value_counter: dict[int, int], buffers: list) -> tuple:
    """What the nodes phase reads about a block's values besides its snapshot: its input and output
    sources (kind, value or binding, count), the buffer holding each value it reads or makes, that
    buffer's plan and the append counter of each value it makes."""
    sources = (*sized.inputs.values(), *sized.outputs.values())
    held = [value_buffer[s.ref] for s in sources if s.kind == "value"]  # type: ignore[index]
    held += [value_buffer[vi] for vi in sized.internal]
    made = sized.made
    return (
        sources,
        tuple(held),
        tuple([buffers[bi] for bi in held]),
        tuple([value_counter.get(vi) for vi in made]) if value_counter else (),
    )


class NodeCache:
    """The node drafts of the last plan, by block id.

    Attributes:
        hits: Blocks whose drafts were reused (since the cache was made).
        misses: Blocks whose drafts were made anew.
        resumed: Plans that resumed from the last one after the blocks an edit did not touch
            (``resume.py``), and the blocks they took as they were (``resumed_blocks``).
    """

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self._next: dict[int, _Entry] = {}
        self.hits = 0
        self.misses = 0
        self.resumed = 0
        self.resumed_blocks = 0
        #: What the last plan left for the next to resume from (``resume.PlanState``; None: plan whole).
        self.state: Any = None
        #: The last plan made with this cache (incremental planning compares the next with it).
        self.plan: Any = None
        #: How ``plan`` differs from the plan before it (``resume.PlanDelta``; None: planned whole).
        self.delta: Any = None
        #: The drafts of the plans made since the caller last took them, with the state, delta and
        #: plan they replaced (``compile_plan`` leaves them here): freed at its return, a 10,000-block
        #: draft was one cascade of deallocations of up to 3.7 ms (CPU machine) that held the
        #: interpreter from the frames whenever the build got there; a build on the build thread
        #: frees them right after a frame ends instead (``BuildOutcome.spent``).
        self.spent: list[Any] = []

    def begin(self) -> None:
        """A nodes phase starts: entries of blocks it does not see are dropped at ``end``."""
        self._next = {}

    def take(self, sized: BlockSizes, first: int, sig: tuple) -> tuple[NodeDraft, ...] | None:
        """The drafts of ``sized.block`` if nothing they depend on changed, else None."""
        e = self._entries.get(sized.block.id)
        if e is not None and e.snapshot is sized.block and e.first == first and e.signature == sig:
            self._next[sized.block.id] = e
            self.hits += 1
            return e.drafts
        self.misses += 1
        return None

    def put(self, sized: BlockSizes, first: int, sig: tuple, drafts: tuple[NodeDraft, ...]) -> None:
        self._next[sized.block.id] = _Entry(sized.block, first, sig, drafts)

    def carry(self, drop: Iterable[int], reused: int) -> None:
        """A nodes phase starts after ``reused`` blocks whose nodes were taken from the last plan as
        they were (incremental planning, ``resume.py``): their entries stay; ``drop``: the blocks the
        last plan had after them."""
        nxt = self._next = dict(self._entries)
        for bid in drop:
            nxt.pop(bid, None)
        self.hits += reused

    def end(self) -> None:
        self._entries, self._next = self._next, {}


def replay_slots(draft: NodeDraft, scalar_slots: dict, binding_slots: dict, counter_users: set[int]) -> None:
    """Record the slots of a node draft from its arguments, as ``_work_node`` does when it makes one: a
    Hot parameter's and a bound input's argument positions, and whether it uses a counter (a reused
    draft; a region's set-condition and step kernels, whose ``Max``/``Count`` and condition are patched too)."""
    index = draft.head[0]
    args = draft.head[-1]  # KernelNodePlan and CapturedNodePlan heads end with their arguments
    for ai, a in enumerate(args):
        kind = a.kind
        if kind == "scalar" or kind == "device":
            slots = scalar_slots.get(a.ref)
            scalar_slots[a.ref] = ((index, ai),) if slots is None else (*slots, (index, ai))
        elif kind == "external":
            slots = binding_slots.get(a.ref)
            binding_slots[a.ref] = ((index, ai),) if slots is None else (*slots, (index, ai))
        elif kind == "counter":
            counter_users.add(index)
