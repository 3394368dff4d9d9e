"""The body-timers phase: at ``PerBlock`` and up, every block (and nested region) inside a region's
body is timed on the device, iteration by iteration, so it gets a time of its own.

The top-level graph is timed by timestamp slots (``stamps.py``), but a slot written inside a loop's body
keeps only the last iteration, and event-record nodes are not allowed in a conditional node's body at
all (the driver takes kernel, empty, child-graph, memset, memcpy and conditional nodes there). So each
unit of a body (a block, or a region nested in it) is one *run* per copy of the body
(``PlanDraft.body_units``, recorded by ``region_nodes``), timed by two one-thread kernels
(``region_kernels.TIMER_SOURCE``):

- a ``body_tick`` writes the GPU's nanosecond timer into a slot when the run may start; the run's entry
  nodes wait for it (a tick merely beside them could run after they started). A run whose outside
  dependencies are exactly the last nodes of one earlier run of the same body needs no tick: it starts
  when that run ends, which that run's tock wrote down. The runs that depend on nothing in the body
  share one tick at its start, per body graph.
- a ``body_tock`` waits for the run's last nodes (and, when the run borrowed its start, for the tock
  that wrote it), and adds ``now - start`` to the unit's record: sum, maximum, minimum and count, with
  atomics, so the copies of an unrolled body add into one record. Nothing waits for a tock but the
  body's end: it never delays the work.

Records and slots are words among the graph's counters (``RegionPlan.timers`` says where each unit's
record is), so the counters' memset zeroes them at the start of every frame and the readback ring
brings them back with the frame's iteration counts, without a stall. The outermost conditional node
holding timers waits for that memset (a plan with only ``If`` regions gets one, first).

The phase runs after ``region_edges`` and inserts its nodes into the finished ones, renumbering every
index the later phases and the plan use, as ``region_stamps`` does. What it costs: the ticks on the
path delay their run by a one-thread launch each iteration, and the region's own time (stamped in the
top-level graph) includes every timer kernel of its body.
"""

from __future__ import annotations

from typing import NamedTuple

from ...kernels.types import DType
from ..plan import Arg, KernelNodePlan, MemsetNodePlan, ProbeNodePlan
from ..profiling import ProfilingLevel
from ..region_kernels import REGION_ENTRIES, TIMER_RECORD_WORDS, TIMER_SLOT_WORDS, region_kernel
from .draft import PlanDraft
from .stamps import renumber

__all__ = ["PAD", "SLOT", "TIMER", "body_timers"]

#: Counter keys ``(block id, label)`` of the timer words: a record's (``TIMER``, of its unit), a slot's
#: (``SLOT``, of the region whose body holds it), the word that aligns the first record on 8 bytes.
TIMER = "~time"
SLOT = "~slot"
PAD = "~pad"

_Key = tuple[str, int]  # ("new", k): a node this phase adds, by its number in ``_Timers.added``


class _Added(NamedTuple):
    """A node the phase adds: a timer kernel in ``scope``'s body, or the counters' memset (top level)."""

    entry: str  # body_tick, body_tock or memset
    region: int
    counters: tuple[int, ...]  # the counter words it reads and writes: slots, then a record
    deps: list  # old node indices, and ``_Key`` of added nodes
    scope: int | None


class _Timers:
    """What the phase builds before it renumbers: the nodes it adds, where, and the new counter words."""

    def __init__(self, draft: PlanDraft) -> None:
        self.draft = draft
        self.added: list[_Added] = []
        self.before: dict[int, list[_Key]] = {}  # old index -> added nodes right before it
        self.after: dict[int, list[_Key]] = {}  # old index -> added nodes right after it
        self.waits: dict[int, list] = {}  # old index -> added nodes (or node 0) it now waits for too
        self.records: dict[int, int] = {}  # unit -> first counter word of its record
        self.timers: dict[int, list[tuple[int, int]]] = {}  # region -> (unit, record) of its body
        self.slots = 0

    def add(self, node: _Added, *, before: int | None = None, after: int | None = None) -> _Key:
        key = ("new", len(self.added))
        self.added.append(node)
        if before is not None:
            self.before.setdefault(before, []).append(key)
        if after is not None:
            self.after.setdefault(after, []).append(key)
        return key

    def words(self, owner: int, label: str, n: int) -> int:
        counters = self.draft.counters
        if len(counters) % 2:  # 64-bit atomics and loads: every record and slot starts on 8 bytes
            counters.append((-1, PAD))
        first = len(counters)
        counters.extend((owner, f"{label}:{first}.{k}") for k in range(n))
        return first

    def record(self, unit: int, region: int) -> int:
        ci = self.records.get(unit)
        if ci is None:
            ci = self.records[unit] = self.words(unit, TIMER, TIMER_RECORD_WORDS)
            self.timers.setdefault(region, []).append((unit, ci))
        return ci

    def slot(self, region: int) -> int:
        return self.words(region, SLOT, TIMER_SLOT_WORDS)


def body_timers(draft: PlanDraft) -> None:
    """Time every run of a unit in a body (see the module docstring); nothing below ``PerBlock``."""
    if not draft.level.at_least(ProfilingLevel.PER_BLOCK) or not draft.body_units:
        return
    nodes, scopes = draft.nodes, draft.scopes
    had_memset = bool(draft.counters)  # node 0 zeroes the counters; the timers' words join them
    t = _Timers(draft)
    roots: dict[int, _Key] = {}  # body (conditional node) -> its shared start tick
    ends: dict[int, tuple[frozenset[int], _Key, int]] = {}  # a run's exit -> (its exits, its tock, end slot)
    for scope, unit, lo, hi in sorted(draft.body_units, key=lambda r: r[2]):
        # not the nodes of nested bodies; nor probes, which read a value beside the work (as at the top level)
        members = [i for i in range(lo, hi) if scopes.get(i) == scope and not isinstance(nodes[i], ProbeNodePlan)]
        if not members:
            continue
        mine = set(members)
        waited = {d for m in members for d in nodes[m].deps if d in mine}
        entry = [m for m in members if not any(d in mine for d in nodes[m].deps)]
        outside = frozenset(d for m in members for d in nodes[m].deps if d not in mine)
        exits = [m for m in members if m not in waited]
        region = nodes[scope].block_id  # type: ignore[union-attr]
        record = t.record(unit, region)
        tock_deps: list = list(exits)
        before = _last_run(nodes, ends, outside) if outside and all(nodes[m].deps for m in entry) else None
        if before is not None:
            tock, start = before  # it starts when that run ended: no tick on its path
            tock_deps.append(tock)
        else:
            if outside:
                start = t.slot(region)
                tick = t.add(_Added("body_tick", region, (start,), sorted(outside), scope), before=members[0])
            else:
                if scope not in roots:
                    first = t.slot(region)
                    roots[scope] = t.add(_Added("body_tick", region, (first,), [], scope), before=scope + 1)
                tick = roots[scope]
                start = t.added[tick[1]].counters[0]
            for m in entry:
                t.waits.setdefault(m, []).append(tick)
        end = t.slot(region)
        tock = t.add(_Added("body_tock", region, (start, end, record), tock_deps, scope), after=hi - 1)
        ran = (frozenset(exits), tock, end)
        ends.update(dict.fromkeys(exits, ran))
    if not t.added:
        return
    memset: object = 0
    if not had_memset:
        memset = t.add(_Added("memset", -1, (), [], None), before=0)
    for scope in {a.scope for a in t.added if a.scope is not None}:
        top = scope
        while top in scopes:
            top = scopes[top]
        if memset not in nodes[top].deps:
            t.waits.setdefault(top, []).append(memset)
    _insert(draft, t)


def _last_run(
    nodes: list, ends: dict[int, tuple[frozenset[int], _Key, int]], outside: frozenset[int]
) -> tuple[_Key, int] | None:
    """The tock and end slot of the earlier run that ends when the last of ``outside`` (a run's outside
    dependencies) is done, if there is one: the run holding the newest of them, when ``outside`` holds
    all its exits and otherwise only nodes those exits wait for (transitively). Then a run that waits
    for several others (the next copy of a body, a block reading two) still needs no tick."""
    ran = ends.get(max(outside))
    if ran is None:
        return None
    exits, tock, end = ran
    if not exits <= outside:
        return None
    rest = outside - exits
    if rest:  # each must come before those exits: search back from them, never below the oldest
        low, seen, stack = min(rest), set(exits), list(exits)
        while stack and not rest <= seen:
            for d in nodes[stack.pop()].deps:
                if d >= low and d not in seen:
                    seen.add(d)
                    stack.append(d)
        if not rest <= seen:
            return None
    return tock, end


def _depth(scopes: dict[int, int], scope: int | None) -> int:
    n = 0
    while scope is not None:
        n += 1
        scope = scopes.get(scope)
    return n


def _insert(draft: PlanDraft, t: _Timers) -> None:
    """Put the added nodes in place and renumber everything that names a node index."""
    old_nodes, scopes = draft.nodes, draft.scopes
    u32 = DType.UINT32
    out: list = []
    remap: dict[int, int] = {}
    placed: dict[_Key, int] = {}
    new_scopes: dict[int, int] = {}

    def index(ref: object) -> int:
        return placed[ref] if isinstance(ref, tuple) else remap[ref]  # type: ignore[index]

    def emit(key: _Key) -> None:
        a = t.added[key[1]]
        i = len(out)
        deps = tuple(sorted({index(d) for d in a.deps}))
        if a.entry == "memset":
            out.append(MemsetNodePlan(i, 0, deps))
        else:
            source, desc = region_kernel(a.entry)
            args = tuple(Arg("counter", u32, True, ci) for ci in a.counters)
            out.append(KernelNodePlan(i, a.region, REGION_ENTRIES[a.entry], source, desc, 1, 1, 0, args, deps))
            new_scopes[i] = remap[a.scope]  # type: ignore[index]
        placed[key] = i

    for n in old_nodes:
        for key in t.before.get(n.index, ()):
            emit(key)
        i = len(out)
        remap[n.index] = i
        deps = [remap[d] for d in n.deps] + [index(w) for w in t.waits.get(n.index, ())]
        out.append(n._replace(index=i, deps=tuple(sorted(set(deps)))))
        # several tocks after one node: the deepest body's first, so each body's nodes stay contiguous
        for key in sorted(t.after.get(n.index, ()), key=lambda k: -_depth(scopes, t.added[k[1]].scope)):
            emit(key)
    draft.nodes = out
    draft.scopes = {remap[i]: remap[p] for i, p in scopes.items()} | new_scopes
    renumber(draft, remap)
    for rid, rp in draft.regions.items():
        draft.regions[rid] = rp._replace(timers=tuple(t.timers.get(rid, ())))
    for i, n in enumerate(out):
        if isinstance(n, MemsetNodePlan) and n.buffer is None:  # the counters' memset: the timers' words too
            out[i] = n._replace(count=len(draft.counters))
