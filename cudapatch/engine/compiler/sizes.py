"""The sizes phase: in topological order, where each block's inputs come from, whether the block
can run, and the element count of every value it makes.

An input reads a link (the upstream block's output value), an external binding, or, when optional
and unbound, nothing. A block is left out, with a diagnostic, when a required input is unlinked,
when it reads a block that was left out, when one of its kernels cannot run yet (``kernel_status``:
still compiling, or failed with no earlier version), or when a captured call rejects its input
counts (``library-shape``). Blocks reading a block that faulted on the GPU run, warned that they
read zeros.

Counts and shapes flow downstream from output size rules (``like`` an input, from a parameter,
fixed, computed, ``shape_of`` axes; see ``shapes``); a ``through`` output carries its input's value
on unchanged. Before a block is accepted, every rule it has must resolve (else ``shape-unresolved``),
each kernel's launch is found from its grid's shape, and each input must cover what those launches
read (else ``input-short`` / ``input-shape``): errors on the block, which then never launches.
"""

from __future__ import annotations

from ..context import BlockSnapshot
from ..diagnostics import Diagnostic, DiagnosticCode, Severity
from ..plan import BufferPlan
from .draft import BlockSizes, KernelStatus, PlanDraft, Source, resolve_count
from .shapes import ShapeError, check_inputs, flat, launch_of, resolve_shape

__all__ = ["sizes"]

_new = tuple.__new__  # skips NamedTuple.__new__: several times cheaper (see plan.py)
_NULL = Source("null", None, 0, flat(0))


def sizes(draft: PlanDraft) -> None:
    """Fill ``draft.sized`` (blocks that run, in order), ``skipped``, ``values``, ``ports``, ``shapes`` and
    ``binding_counts``, afresh (``size_regions`` runs it again when it leaves a region out); add a
    diagnostic for every block left out and every reader of a faulted block."""
    draft.sized, draft.skipped, draft.values, draft.ports, draft.shapes, draft.binding_counts = {}, [], [], {}, {}, {}
    skipped: set[int] = set()
    for bid in draft.order:
        size_block(draft, bid, skipped)


def size_block(draft: PlanDraft, bid: int, skipped: set[int]) -> None:
    """The sizes phase for one block, after every block before it in ``draft.order`` (``skipped``: the
    blocks left out so far, added to). Incremental planning (``resume.py``) runs it from the first
    block an edit touched."""
    blocks, incoming, bindings = draft.blocks, draft.incoming, draft.snap.bindings
    kernel_status, faulted, warnings = draft.kernel_status, draft.faulted, draft.warnings
    sized, binding_counts = draft.sized, draft.binding_counts
    b = blocks[bid]
    d = b.description
    inputs: dict[str, Source] = {}
    skip_reason = draft.left_out.get(bid) if draft.left_out else None  # its region is not running
    cascade = False  # left out because an upstream block is: one summary log line per build
    feedback = d.feedback_inputs if d.feedback else ()
    for port in () if skip_reason else d.inputs:
        if port.name in feedback:  # written later in the frame, read next frame: the delays phase links it
            continue
        key = (bid, port.name)
        lk = incoming.get(key)
        if lk is not None:
            if lk.src in skipped:
                skip_reason = f"input '{port.name}' comes from '{blocks[lk.src].name}', which is not running"
                cascade = True
                break
            if faulted and lk.src in faulted:
                warnings.append(
                    Diagnostic(
                        "warning",
                        bid,
                        DiagnosticCode.INPUT_FAULTED,
                        f"input '{port.name}' of '{b.name}' reads zeros: '{blocks[lk.src].name}' faulted on the GPU",
                    )
                )
            inputs[port.name] = sized[lk.src].outputs[lk.src_port]
            continue
        binding = bindings.get(key)
        if binding is not None:
            shape = binding.shape or flat(binding.count)
            inputs[port.name] = _new(Source, ("external", key, binding.count, shape))
            binding_counts[key] = binding.count
        elif port.required:
            skip_reason = f"required input '{port.name}' is not linked"
            break
        else:
            inputs[port.name] = _NULL
    severity: Severity = "warning"
    code = (
        DiagnosticCode.REGION_NOT_RUNNING
        if bid in draft.left_out
        else DiagnosticCode.INPUT_NOT_RUNNING
        if cascade
        else DiagnosticCode.INPUT_UNLINKED
    )
    if skip_reason is None:
        problem = _kernels_not_ready(b, inputs, kernel_status)
        if problem is not None:
            severity, code, skip_reason = problem
    launches: tuple = ()
    if skip_reason is None:
        try:
            launches = _launches(b, inputs)
            problem = check_inputs(d, inputs, b.values)
        except ShapeError as exc:
            problem = (DiagnosticCode.SHAPE_UNRESOLVED, str(exc))
        if problem is not None:
            severity, code, skip_reason = "error", problem[0], problem[1]
    if skip_reason is None:
        try:
            sized[bid] = _make_values(draft, b, inputs, launches)
            _source_warnings(b, warnings)
            return
        except ShapeError as exc:
            severity, code, skip_reason = "error", DiagnosticCode.SHAPE_UNRESOLVED, str(exc)
    warnings.append(Diagnostic(severity, bid, code, f"block '{b.name}' is not running: {skip_reason}"))
    skipped.add(bid)
    draft.skipped.append(bid)


def _source_warnings(b: BlockSnapshot, warnings: list[Diagnostic]) -> None:
    """A running block's kernel sources' own warnings (``ProgramSource.warning``: an Expression's
    declared names its code does not use), one per build."""
    for ks in b.description.kernels:
        note = getattr(ks.source, "warning", None)
        if note:
            warnings.append(
                Diagnostic("warning", b.id, DiagnosticCode.EXPRESSION_DECLARATION, f"block '{b.name}': {note}")
            )


def _launches(b: BlockSnapshot, inputs: dict[str, Source]) -> tuple:
    """Each kernel's launch (None for captured calls), after checking its count rules resolve.

    Raises:
        ShapeError: a grid or count rule that cannot be resolved, or a launch over too few axes.
    """
    out = []
    params = b.values
    for ks in b.description.kernels:
        if ks.source is None:  # a captured call: no grid
            out.append(None)
            continue
        for _pi, rule in ks.counts:
            if rule.fn is not None or rule.dims or rule.axis is not None:  # the rules that can fail
                resolve_shape(rule, inputs, params)
        grid = ks.grid
        if grid is None:
            out.append(launch_of(ks, None))
        elif ks.dims == 1:  # elements: the count is all it takes (no Shape made, the common case)
            block = ks.descriptor.launch_block(1)
            n = resolve_count(grid, inputs, params)
            out.append(((max(1, -(-n // block[0])), 1, 1), block))
        else:
            out.append(launch_of(ks, resolve_shape(grid, inputs, params)))
    return tuple(out)


def _kernels_not_ready(
    b: BlockSnapshot, inputs: dict[str, Source], kernel_status: KernelStatus | None
) -> tuple[Severity, str, str] | None:
    """Why the kernels of block ``b`` cannot run yet, as ``(severity, code, reason)``, or None: one
    is still compiling or failed (``kernel_status``), or a captured call rejects its input counts."""
    kernels = b.description.kernels
    if kernel_status:
        for ki in range(len(kernels)):
            status = kernel_status.get((b.id, ki))
            if status is not None:
                return status
    for ks in kernels:
        if ks.source is None:  # a captured call checks its input shapes
            check, code = ks.validate, DiagnosticCode.LIBRARY_SHAPE
        else:  # a generated kernel checks its inputs' lengths (``ProgramSource.check_counts``)
            check, code = getattr(ks.source, "check_counts", None), DiagnosticCode.INPUT_SIZE
        if check is not None:
            problem = check({name: src.count for name, src in inputs.items()}, b.values)  # type: ignore[misc]
            if problem:
                return "error", code, f"'{ks.descriptor.entry_point}': {problem}"
    return None


def _make_values(draft: PlanDraft, b: BlockSnapshot, inputs: dict[str, Source], launches: tuple) -> BlockSizes:
    """The values block ``b`` makes (its outputs in port order, then its internal links), sized.

    Raises:
        ShapeError: an output's or internal link's rule cannot be resolved (nothing is recorded then).
    """
    d, bid, params = b.description, b.id, b.values
    values, ports, shapes = draft.values, draft.ports, draft.shapes
    sized: list[tuple] = []  # resolved first, recorded after: a rule that fails leaves no trace
    for port in d.outputs:
        if port.kind != "through":
            rule = port.size
            if rule.flat_only:  # type: ignore[union-attr]
                n = resolve_count(rule, inputs, params)  # type: ignore[arg-type]
                sized.append((n, None))
            elif rule.keeps_shape:  # type: ignore[union-attr]  # like("In"): the input's count and shape
                src = inputs[rule.like]  # type: ignore[index, union-attr]
                dims, channels = src.shape
                sized.append((src.count, src.shape if len(dims) > 1 or channels > 1 else None))
            else:
                shape = resolve_shape(rule, inputs, params)  # type: ignore[arg-type]
                sized.append((shape.count, shape if shape.ndim > 1 or shape.channels > 1 else None))
    link_counts = [resolve_count(link.size, inputs, params) for link in d.internal_links]
    first = len(values)
    made = iter(sized)
    outputs: dict[str, Source] = {}
    for port in d.outputs:
        if port.kind == "through":  # the input's buffer, modified in place, flows on
            src = outputs[port.name] = inputs[port.name]
            if src.kind == "value":
                ports[(bid, port.name)] = src.ref  # type: ignore[assignment]
            continue
        count, shape = next(made)
        vi = len(values)
        values.append(_new(BufferPlan, (vi, bid, port.name, port.dtype, count, port.kind == "append")))
        if shape is None:
            shape = flat(count)
        else:
            shapes[(bid, port.name)] = shape
        outputs[port.name] = _new(Source, ("value", vi, count, shape))
        ports[(bid, port.name)] = vi
    internal: tuple[int, ...] = ()
    if d.internal_links:
        internal = tuple(range(len(values), len(values) + len(d.internal_links)))
        for i, link in enumerate(d.internal_links):
            values.append(_new(BufferPlan, (len(values), bid, f"internal{i}", link.dtype, link_counts[i], False)))
    return _new(BlockSizes, (b, inputs, outputs, internal, range(first, len(values)), launches))
