"""The sizes phase: in topological order, where each block's inputs come from, whether the block
can run, and the element count of every value it makes.

An input reads a link (the upstream block's output value), an external binding, or, when optional
and unbound, nothing. A block is left out, with a diagnostic, when a required input is unlinked,
when it reads a block that was left out, when one of its kernels cannot run yet (``kernel_status``:
still compiling, or failed with no earlier version), or when a captured call rejects its input
counts (``library-shape``). Blocks reading a block that faulted on the GPU run, warned that they
read zeros.

Counts flow downstream from output size rules (``like`` an input, from a parameter, fixed or
computed); a ``through`` output carries its input's value on unchanged. This is the room where
shape propagation grows: today a value is an element count.
"""

from __future__ import annotations

from ..context import BlockSnapshot
from ..diagnostics import Diagnostic, Severity
from ..plan import BufferPlan
from .draft import BlockSizes, KernelStatus, PlanDraft, Source, resolve_count

__all__ = ["sizes"]

_new = tuple.__new__  # skips NamedTuple.__new__: several times cheaper (see plan.py)
_NULL = Source("null", None, 0)


def sizes(draft: PlanDraft) -> None:
    """Fill ``draft.sized`` (blocks that run, in order), ``skipped``, ``values``, ``ports`` and
    ``binding_counts``; add a diagnostic for every block left out and every reader of a faulted block."""
    blocks, incoming, bindings = draft.blocks, draft.incoming, draft.snap.bindings
    kernel_status, faulted, warnings = draft.kernel_status, draft.faulted, draft.warnings
    sized, binding_counts = draft.sized, draft.binding_counts
    skipped: set[int] = set()
    for bid in draft.order:
        b = blocks[bid]
        d = b.description
        inputs: dict[str, Source] = {}
        skip_reason = None
        for port in d.inputs:
            key = (bid, port.name)
            lk = incoming.get(key)
            if lk is not None:
                if lk.src in skipped:
                    skip_reason = f"input '{port.name}' comes from '{blocks[lk.src].name}', which is not running"
                    break
                if faulted and lk.src in faulted:
                    warnings.append(
                        Diagnostic(
                            "warning",
                            bid,
                            "input-faulted",
                            f"input '{port.name}' of '{b.name}' reads zeros: "
                            f"'{blocks[lk.src].name}' faulted on the GPU",
                        )
                    )
                inputs[port.name] = sized[lk.src].outputs[lk.src_port]
                continue
            binding = bindings.get(key)
            if binding is not None:
                inputs[port.name] = _new(Source, ("external", key, binding.count))
                binding_counts[key] = binding.count
            elif port.required:
                skip_reason = f"required input '{port.name}' is not linked"
                break
            else:
                inputs[port.name] = _NULL
        severity: Severity = "warning"
        code = "input-unlinked"
        if skip_reason is None:
            problem = _kernels_not_ready(b, inputs, kernel_status)
            if problem is not None:
                severity, code, skip_reason = problem
        if skip_reason is not None:
            warnings.append(Diagnostic(severity, bid, code, f"block '{b.name}' is not running: {skip_reason}"))
            skipped.add(bid)
            draft.skipped.append(bid)
            continue
        sized[bid] = _make_values(draft, b, inputs)


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
            check, code = ks.validate, "library-shape"
        else:  # a generated kernel checks its inputs' lengths (``ProgramSource.check_counts``)
            check, code = getattr(ks.source, "check_counts", None), "input-size"
        if check is not None:
            problem = check({name: src.count for name, src in inputs.items()}, b.values)
            if problem:
                return "error", code, f"'{ks.descriptor.entry_point}': {problem}"
    return None


def _make_values(draft: PlanDraft, b: BlockSnapshot, inputs: dict[str, Source]) -> BlockSizes:
    """The values block ``b`` makes (its outputs in port order, then its internal links), sized."""
    d, bid, params = b.description, b.id, b.values
    values, ports = draft.values, draft.ports
    first = len(values)
    outputs: dict[str, Source] = {}
    for port in d.outputs:
        if port.kind == "through":  # the input's buffer, modified in place, flows on
            src = outputs[port.name] = inputs[port.name]
            if src.kind == "value":
                ports[(bid, port.name)] = src.ref  # type: ignore[assignment]
            continue
        count = resolve_count(port.size, inputs, params)  # type: ignore[arg-type]
        vi = len(values)
        values.append(_new(BufferPlan, (vi, bid, port.name, port.dtype, count, port.kind == "append")))
        outputs[port.name] = _new(Source, ("value", vi, count))
        ports[(bid, port.name)] = vi
    internal: tuple[int, ...] = ()
    if d.internal_links:
        internal = tuple(range(len(values), len(values) + len(d.internal_links)))
        for i, link in enumerate(d.internal_links):
            count = resolve_count(link.size, inputs, params)
            values.append(_new(BufferPlan, (len(values), bid, f"internal{i}", link.dtype, count, False)))
    return _new(BlockSizes, (b, inputs, outputs, internal, range(first, len(values))))
