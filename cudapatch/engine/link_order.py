"""SameFrameOrder: whether a new link would close a loop within one frame, without walking the patch.

``Context.connect`` refuses a link that closes a cycle not broken by a feedback input (a
``FrameDelay``'s ``In``, read a frame late). Walking everything downstream of the link's end to look
for its start took 20 ms of a host's ``connect`` into the middle of a 10,000-block chain on the CPU
machine (a hot swap or an insert there), so blocks keep ranks that every same-frame link climbs
(``rank[src] < rank[dst]``). A link that climbs already can close no cycle: O(1). One that does not
searches only the blocks ranked between its ends, forwards from its end and backwards from its start
in turns, and stops when either side has seen all it can reach: a block inserted into a long chain
meets its one upstream neighbour there, not the chain below (the two-way search of Haeupler et al.,
*Incremental cycle detection, topological ordering, and strong component maintenance*, 2012). The
side that finished is then re-ranked past the other end, and the ranks climb again.

Whether a link is same-frame depends on its input's description, which a re-description may
change: the owner calls ``invalidate`` then, and the next check ranks every linked block afresh
(Kahn's algorithm, O(blocks + links)). While the same-frame links hold a cycle (a re-description
closed one; the next build reports it) checks walk the patch as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .connections import ConnectionGraph, Link

__all__ = ["SameFrameOrder", "cycle_message"]

#: A gap this small (relative to the ranks it lies between) is not split again: the next check
#: ranks every block afresh.
_TIGHTEST = 1e-9


def cycle_message(src: str, src_port: str, dst: str, dst_port: str, loop: list[str] | None) -> str:
    """The error for a link ``src.src_port -> dst.dst_port`` that would close a same-frame loop.

    Args:
        loop: The blocks from ``dst`` back to ``src`` along same-frame links (``[dst, ..., src]``, one
            name when the link goes back into its own block); None when unknown.
    """
    where = f" (loop: {' -> '.join([src, *loop])})" if loop else ""
    return (
        f"linking {src}.{src_port} to {dst}.{dst_port} would make a cycle; a loop must pass through a FrameDelay{where}"
    )


class SameFrameOrder:
    """Ranks of the linked blocks of ``links`` such that every same-frame link climbs.

    Args:
        links: The patch's links (read, never changed here).
        same_frame: Whether a link is followed within a frame (False: it goes into a feedback input).
    """

    def __init__(self, links: ConnectionGraph, same_frame: Callable[[Link], bool]) -> None:
        self._links = links
        self._same_frame = same_frame
        self._rank: dict[int, float] = {}
        self._top = 0.0  # above every rank
        self._valid = True  # the ranks climb along every same-frame link
        self._acyclic = True  # (when not: the same-frame links hold a cycle; checks walk the patch)

    def invalidate(self) -> None:
        """Which links are same-frame may have changed (a block re-described): rank afresh at the next check."""
        self._valid = False

    def forget(self, block_id: int) -> None:
        """``block_id`` left the patch (its links went with it)."""
        self._rank.pop(block_id, None)

    def admit(self, src: int, dst: int) -> bool:
        """Whether a same-frame link ``src -> dst`` keeps the patch free of same-frame cycles (False:
        ``dst`` reaches ``src`` within a frame, or they are one block). When it does, the ranks are made
        to climb along it: add the link next."""
        if src == dst:
            return False
        if not self._valid:
            self._rank_afresh()
        if not self._acyclic:
            self._valid = False  # (rank afresh at the next check: the cycle may be gone by then)
            return not self._links.reaches(dst, src, follow=self._same_frame)
        try:
            return self._admit_ranked(src, dst)
        except KeyError:  # a linked block with no rank (cannot happen while links come through here): afresh
            self._rank_afresh()
            return self.admit(src, dst)

    def _admit_ranked(self, src: int, dst: int) -> bool:
        rank = self._rank
        rs, rd = rank.get(src), rank.get(dst)
        if rs is None:
            rs = rank[src] = self._new_top()
        if rd is None:
            rd = rank[dst] = self._new_top()
        if rs < rd:
            return True
        return self._search_and_rerank(src, dst, rd, rs)

    # -- the two-way search ---------------------------------------------------------------------
    def _forward(self, v: int) -> Iterable[int]:
        same = self._same_frame
        return [lk.dst for lk in self._links.links_of(v) if lk.src == v and same(lk)]

    def _backward(self, v: int) -> Iterable[int]:
        same = self._same_frame
        return [lk.src for lk in self._links.links_of(v) if lk.dst == v and same(lk)]

    def _search_and_rerank(self, src: int, dst: int, low: float, high: float) -> bool:
        rank = self._rank
        ahead, behind = [dst], [src]  # reached from dst (ranked below src); reaching src (ranked above dst)
        ahead_seen, behind_seen = {dst}, {src}
        a = b = 0
        while True:
            if a == len(ahead):  # everything dst reaches below src is seen: it goes above src
                self._move(ahead, above=high, successors=True)
                return True
            v = ahead[a]
            a += 1
            for w in self._forward(v):
                if w in behind_seen:  # dst reaches w, which reaches src
                    return False
                if w not in ahead_seen and rank[w] < high:
                    ahead_seen.add(w)
                    ahead.append(w)
            if b == len(behind):  # everything above dst that reaches src is seen: it goes below dst
                self._move(behind, above=None, below=low)
                return True
            u = behind[b]
            b += 1
            for p in self._backward(u):
                if p in ahead_seen:
                    return False
                if p not in behind_seen and rank[p] > low:
                    behind_seen.add(p)
                    behind.append(p)

    def _move(
        self, group: list[int], *, above: float | None, below: float | None = None, successors: bool = False
    ) -> None:
        """Re-rank ``group`` (keeping its order) just above ``above`` and below its successors outside
        it, or just below ``below`` and above its predecessors outside it."""
        rank = self._rank
        group.sort(key=rank.__getitem__)
        inside = set(group)
        if successors:
            assert above is not None
            bound = min(
                (rank[w] for v in group for w in self._forward(v) if w not in inside),
                default=None,
            )
            lo, hi = above, (bound if bound is not None else max(above, self._top) + len(group) + 1)
        else:
            assert below is not None
            bound = max(
                (rank[p] for v in group for p in self._backward(v) if p not in inside),
                default=None,
            )
            lo, hi = (bound if bound is not None else below - len(group) - 1), below
        step = (hi - lo) / (len(group) + 1)
        if step <= _TIGHTEST * max(1.0, abs(lo), abs(hi)):
            self._valid = False  # (the link goes in now; the next check ranks everything afresh)
            return
        for i, v in enumerate(group, 1):
            rank[v] = lo + i * step
        self._top = max(self._top, hi)

    # -- afresh ---------------------------------------------------------------------------------------
    def _new_top(self) -> float:
        self._top += 1.0
        return self._top

    def _rank_afresh(self) -> None:
        """Kahn's algorithm over the same-frame links: ranks 0, 1, 2 ... in a topological order."""
        same = self._same_frame
        succ: dict[int, list[int]] = {}
        indegree: dict[int, int] = {}
        for lk in self._links:
            indegree.setdefault(lk.src, 0)
            indegree.setdefault(lk.dst, 0)
            if same(lk):
                succ.setdefault(lk.src, []).append(lk.dst)
                indegree[lk.dst] += 1
        ready = [v for v, d in indegree.items() if d == 0]
        rank: dict[int, float] = {}
        while ready:
            v = ready.pop()
            rank[v] = float(len(rank))
            for w in succ.get(v, ()):
                indegree[w] -= 1
                if indegree[w] == 0:
                    ready.append(w)
        self._acyclic = len(rank) == len(indegree)
        for v in indegree:  # (on a cycle: ranked anyhow, and checks walk the patch until it is gone)
            if v not in rank:
                rank[v] = float(len(rank))
        self._rank, self._top, self._valid = rank, float(len(rank)), True
