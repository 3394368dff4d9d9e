"""What keeps a live edit of a patch file all or nothing: checks of the patch an edit would make, run
before the running one is touched, and the state to put back if applying still fails part way.

``apply_patch`` changes the adapter in steps (links out, operators, regions, links in), and a link
refused at the last step used to leave the steps before it done: a reload that added an operator,
changed a value and closed a loop without a ``FrameDelay`` was refused, yet the next frame built the
added operator and the changed value. So the structure the edit would make is checked first, against
the blocks of the running patch and the ones the edit builds off to the side (``check_structure``):
every link's ports and element types, loops that do not pass through a ``FrameDelay``'s ``In``
(named block by block), regions and kept outputs. What cannot be known before (a kernel file that
changes between the check and the build) is undone by ``Saved.restore``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..blocks.block import Block
from ..blocks.description import BlockDescription
from ..blocks.regions import Region
from ..engine.compiler.order import topological_order
from ..engine.connections import find_path
from ..engine.context import check_link_ports
from ..engine.link_order import cycle_message
from ..errors import LinkError, PatchFileError

if TYPE_CHECKING:
    from .adapter import HostAdapter, OperatorLink
    from .patch import LinkSpec, OperatorSpec, Patch

log = logging.getLogger("cudapatch.host")


def same_spec(adapter: HostAdapter, a: OperatorSpec | None, b: OperatorSpec) -> bool:
    """Whether ``b`` makes the same block as ``a`` (its line may differ): ``apply_patch`` leaves it alone."""
    if a is None or a.params != b.params or a.fuse != b.fuse:
        return False
    return a.type == b.type or adapter.registry.get(a.type).name == adapter.registry.get(b.type).name


def check_structure(
    adapter: HostAdapter, new: Patch, old: Patch | None, probes: dict[str, Block], changed: set[str], lines: Any
) -> None:
    """Refuse ``new`` before anything changes when its regions, links or kept outputs would be refused.

    Args:
        probes: A block built off to the side for each operator of ``new``, as the edit makes it.
        changed: The operators of ``new`` the edit creates, swaps or changes (``same_spec`` tells).
        lines: ``new``'s line index (``patch._Lines``).

    Raises:
        PatchFileError: at the line of the region, link or ``keep`` setting.
    """
    file = str(new.path) if new.path else "<patch>"
    # An operator the edit leaves alone keeps its block: its description is the running one.
    descs = {n: (probes[n] if n in changed else adapter.block(n)).description for n in new.operators}
    for name, spec in new.operators.items():
        if spec.region is not None and not isinstance(probes[spec.region], Region):
            raise PatchFileError(
                f"operator '{name}': '{spec.region}' ({new.operators[spec.region].type}) is not a region: "
                "use an If, While or For",
                file=file,
                line=lines.key("region", spec.line),
                block=name,
            )
    links, listed = _final_links(adapter, new, old, descs)
    for lk in listed:
        _check_link(lk, descs, file)
    running = {(lk.src, lk.src_port, lk.dst, lk.dst_port) for lk in adapter.links()}
    added = [lk for lk in listed if lk.key not in running or {lk.src, lk.dst} & changed]
    _check_loops(links, added, descs, file)
    _check_keep(adapter, new, descs, file, lines)


def _final_links(
    adapter: HostAdapter, new: Patch, old: Patch | None, descs: dict[str, BlockDescription]
) -> tuple[list[LinkSpec], list[LinkSpec]]:
    """The links the patch will have, and those of them the file lists (in its order): the running
    links the edit keeps (those whose ports no longer fit are dropped, as ``hot_swap`` drops them),
    then the file's, an input keeping the last link listed into it."""
    from .patch import LinkSpec

    listed = {lk.key: lk for lk in new.links}
    removed = {lk.key for lk in (old.links if old is not None else [])} - listed.keys()
    into: dict[tuple[str, str], LinkSpec] = {}
    for lk in adapter.links():
        key = (lk.src, lk.src_port, lk.dst, lk.dst_port)
        if key in removed or key in listed or lk.src not in descs or lk.dst not in descs:
            continue
        if descs[lk.src].output(lk.src_port) is not None and descs[lk.dst].input(lk.dst_port) is not None:
            into[(lk.dst, lk.dst_port)] = LinkSpec(*key)
    for lk in new.links:
        into[(lk.dst, lk.dst_port)] = lk
    last = set(map(id, into.values()))
    return list(into.values()), [lk for lk in new.links if id(lk) in last]


def _check_link(lk: LinkSpec, descs: dict[str, BlockDescription], file: str) -> None:
    """The ports of ``lk`` exist on the blocks the edit makes, and their element types fit: what
    ``Context.connect`` will check, at the link's line."""
    try:
        check_link_ports(descs[lk.src], lk.src, lk.src_port, descs[lk.dst], lk.dst, lk.dst_port)
    except LinkError as exc:
        message = f"link {lk}: {exc.message}"
        raise PatchFileError(message, file=file, line=lk.line, block=exc.block, port=exc.port) from None


def _check_loops(links: list[LinkSpec], added: list[LinkSpec], descs: dict[str, BlockDescription], file: str) -> None:
    """Refuse a link of ``added`` that closes a loop of same-frame links (not into a ``FrameDelay``'s
    ``In``), naming the loop's blocks. A patch without a loop costs one ordering of its blocks (the
    compiler's ``topological_order``); only one with a loop pays for finding which link closes it."""
    same_frame = [lk for lk in links if lk.dst_port not in descs[lk.dst].feedback_inputs]
    _, cyclic = topological_order(list(descs), same_frame)
    if not cyclic:
        return
    behind = set(cyclic)  # the blocks on a loop, and those after one: every loop lies within them
    succ: dict[str, list[str]] = {}
    for lk in same_frame:
        if lk.src in behind and lk.dst in behind:
            succ.setdefault(lk.src, []).append(lk.dst)
    for lk in reversed(added):  # step by step, the last link listed is the one that closes the loop
        if lk.src in behind and lk.dst in behind and lk.dst_port not in descs[lk.dst].feedback_inputs:
            loop = find_path(lk.dst, lk.src, lambda v: succ.get(v, ()))
            if loop is not None:
                msg = cycle_message(lk.src, lk.src_port, lk.dst, lk.dst_port, loop)
                raise PatchFileError(f"link {lk}: {msg}", file=file, line=lk.line, block=lk.dst, port=lk.dst_port)


def _check_keep(adapter: HostAdapter, new: Patch, descs: dict[str, BlockDescription], file: str, lines: Any) -> None:
    """``[engine] keep`` names ports of operators of ``new`` (as ``Context.keep`` checks them)."""
    wanted = new.engine.get("keep", [])
    if not wanted or getattr(adapter.engine, "keep", None) is None:
        return
    for text in wanted:
        op, _, port = text.strip().partition(".")
        d = descs.get(op)
        if d is None or (d.output(port) is None and d.input(port) is None):
            what = f"no operator '{op}'" if d is None else f"no such port '{port}' on '{op}'"
            line = lines.key("keep", lines.table("engine"))
            raise PatchFileError(f"keep: {what}", file=file, line=line, block=op if d is not None else None)


@dataclass
class Saved:
    """What an edit may change, as it was before: ``restore`` puts it back."""

    blocks: dict[str, Block]
    types: dict[str, str]
    links: tuple[OperatorLink, ...]
    regions: dict[str, str]
    bypassed: dict[str, bool]
    values: dict[str, dict[str, Any]]  # of the operators the edit changes: every parameter's value
    fuse: dict[str, bool]

    @classmethod
    def of(cls, adapter: HostAdapter, changing: set[str]) -> Saved:
        """The adapter's state now; parameter values only of the running operators in ``changing``."""
        types = adapter.operators()
        blocks = {op: adapter.block(op) for op in types}
        return cls(
            blocks=blocks,
            types=types,
            links=adapter.links(),
            regions=adapter.regions(),
            bypassed={op: not b.enabled for op, b in blocks.items()},
            values={op: {k: p.value for k, p in blocks[op].params.items()} for op in changing if op in blocks},
            fuse={op: blocks[op].fuse for op in changing if op in blocks and hasattr(blocks[op], "fuse")},
        )

    def restore(
        self, adapter: HostAdapter, keep_before: set[tuple[str, str]], keep_tried: set[tuple[str, str]]
    ) -> None:
        """Put the adapter back as it was: operators the edit made are deleted, swapped ones get their
        type and values back (a new block), changed ones their values (the same block); then regions,
        links, kept outputs and bypass flags. Never raises: what cannot be put back is logged."""
        failures: list[str] = []

        def attempt(what: str, fn: Any, *args: Any) -> Any:
            try:
                return fn(*args)
            except Exception as exc:  # noqa: BLE001 - undoing goes on; the edit's own error is the one raised
                failures.append(f"{what}: {exc}")
                return None

        before = set(self.links)
        for lk in set(adapter.links()) - before:
            attempt(f"link {lk}", adapter.disconnect, lk.src, lk.src_port, lk.dst, lk.dst_port)
        for op in adapter.operators().keys() - self.types.keys():
            attempt(f"operator '{op}'", adapter.delete, op)
        present = adapter.operators()
        for op, block in self.blocks.items():
            if op not in present:
                failures.append(f"operator '{op}' is gone")  # (deletes come last in apply_patch: cannot happen)
            elif adapter.block(op) is not block:
                attempt(f"operator '{op}'", self._unswap, adapter, op)
            elif op in self.values:
                attempt(f"operator '{op}'", self._put_values, block, op)
        placed = adapter.regions()
        misplaced = [op for op in self.blocks if op in present and placed.get(op) != self.regions.get(op)]
        for op in misplaced:  # out first, then in: a region may have been put inside what it held
            attempt(f"operator '{op}'", adapter.place, op, None)
        for op in misplaced:
            if self.regions.get(op) is not None:
                attempt(f"operator '{op}'", adapter.place, op, self.regions[op])
        for lk in self.links:  # (every one: a re-described block may have lost some in the engine)
            attempt(f"link {lk}", adapter.connect, lk.src, lk.src_port, lk.dst, lk.dst_port)
        keep = getattr(adapter.engine, "keep", None)
        if keep is not None:
            for op, port in sorted(keep_before | keep_tried):
                if op in present:
                    attempt(f"keep {op}.{port}", keep, adapter.block(op), port, (op, port) in keep_before)
        for op, on in self.bypassed.items():
            if op in present and adapter.bypassed(op) != on:
                attempt(f"bypass of '{op}'", adapter.set_bypass, op, on)
        if failures:
            log.error("a failed edit could not be undone in full: %s", "; ".join(failures))

    def _unswap(self, adapter: HostAdapter, op: str) -> None:
        # fused as it was from the constructor (_put_values's set_fuse would describe the block a second time)
        adapter.hot_swap(op, self.types[op], fuse=self.fuse.get(op, True))
        self._put_values(adapter.block(op), op)

    def _put_values(self, block: Block, op: str) -> None:
        """The saved values of ``op`` on ``block``: text first (it re-describes the block), then the rest."""
        if op in self.fuse and getattr(block, "fuse", None) != self.fuse[op]:
            set_fuse(block, self.fuse[op])
        values = self.values.get(op, {})
        for key in sorted(values, key=lambda k: block.params[k].spec.kind != "text" if k in block.params else True):
            p = block.params.get(key)
            if p is not None and not _same(p.value, values[key]):
                block.set(key, values[key])


def set_fuse(block: Block, on: bool) -> None:
    """Let ``block`` (a ``Fusable``) fuse, or keep it out of fused groups, by describing it again."""
    block.fuse = on  # type: ignore[attr-defined]
    block.refresh()


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except (TypeError, ValueError):  # an array parameter: compared element by element is ambiguous
        return False
