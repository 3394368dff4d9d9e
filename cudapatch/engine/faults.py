"""FaultState: what failures left behind that outlives one build, and when each is forgiven.

Three kinds, each with its own rule:

- **Blocks disabled by a GPU fault** (``engine.recovery`` finds them, a host may name them through
  ``Engine.disable``): builds leave their kernels out and zero-fill their outputs, until the block's
  code changes or it is removed.
- **Library calls that failed to capture**: the block is left out of the graph, so the rest builds,
  until the block's parameters or inputs change (its values then differ from those tried) or any
  edit of the patch asks for another try.
- **The context itself**: lost (CUDA refuses the process after a fault), or reset with the external
  inputs unbound (their memory died with it; each is warned until it is bound again).

The engine and recovery change this state only through the named operations below, so each rule
lives in one place. Pure data: no driver call, tested without a GPU (``tests/unit/test_faults.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .diagnostics import Diagnostic, DiagnosticCode, Severity

__all__ = ["FaultState", "tried_values"]

Status = dict[tuple[int, int], tuple[Severity, str, str]]


def tried_values(block: Any) -> tuple:
    """What a library call was tried with: a snapshot block's parameter values and description."""
    return (tuple(sorted((k, repr(v)) for k, v in dict(block.values).items())), block.description)


@dataclass(frozen=True)
class _CallFailure:
    kernel: int  # index of the block's captured call
    values: tuple  # ``tried_values`` of the block when it failed
    message: str


class FaultState:
    """Disabled blocks, failed library calls and the context's fate, for one engine."""

    def __init__(self) -> None:
        self._disabled: dict[int, str] = {}
        self._calls: dict[int, _CallFailure] = {}
        #: Why the engine stopped launching (CUDA refuses the process after a fault), or None. Read
        #: only (``mark_lost`` sets it); a plain attribute because every ``update()`` tests it first.
        self.lost: str | None = None
        self._lost_inputs: dict[tuple[int, str], Diagnostic] = {}

    # -- edits of the patch -------------------------------------------------------------------------
    def patch_edited(self) -> None:
        """An edit (block added, link changed, input bound) may fix a failed library call: every
        failed call gets another try at the next build."""
        self._calls.clear()

    def block_removed(self, block_id: int) -> None:
        """Forget everything about a removed block (and retry failed calls: the patch changed)."""
        self._disabled.pop(block_id, None)
        for key in [k for k in self._lost_inputs if k[0] == block_id]:
            del self._lost_inputs[key]
        self._calls.clear()

    def input_bound(self, block_id: int, port: str) -> None:
        """An input was bound: its lost-binding warning is resolved (and failed calls are retried).
        Cheap when there is nothing to forgive: some hosts rebind every frame (ping-pong buffers)."""
        if self._lost_inputs:
            self._lost_inputs.pop((block_id, port), None)
        if self._calls:
            self._calls.clear()

    def code_changed(self, block_id: int) -> bool:
        """A block's kernel code changed: new code gets a new chance. Returns whether the block was
        disabled (the graph must then be rebuilt with it)."""
        return self._disabled.pop(block_id, None) is not None

    # -- GPU faults --------------------------------------------------------------------------------------
    def disable(self, block_id: int, reason: str) -> None:
        """Leave ``block_id``'s kernels out of the graph; ``reason`` is its error until its code changes."""
        self._disabled[block_id] = reason

    @property
    def disabled(self) -> Mapping[int, str]:
        """Disabled blocks (id → reason), as ``compile_plan`` takes them (read-only view)."""
        return self._disabled

    def is_disabled(self, block_id: int) -> bool:
        return block_id in self._disabled

    def inputs_lost(self, inputs: Iterable[tuple[int, str, str]]) -> None:
        """The context was reset and these external inputs ``(block id, port, name shown)`` unbound:
        warn each until it is bound again. Replaces the warnings of an earlier reset."""
        self._lost_inputs = {
            (bid, port): Diagnostic(
                "warning",
                bid,
                DiagnosticCode.BINDING_LOST,
                f"input '{shown}' lost its memory in the GPU fault; bind it again",
            )
            for bid, port, shown in inputs
        }

    def mark_lost(self, reason: str) -> None:
        """CUDA refuses to continue in this process: nothing launches any more."""
        self.lost = reason
        self._lost_inputs.clear()  # nothing can be bound again in this process

    # -- library calls ----------------------------------------------------------------------------------
    def call_failed(self, tried: Any, message: str) -> bool:
        """Leave ``tried``'s block (a snapshot block whose library call failed to capture) out of the
        graph until its values change. Returns False when that block had already failed: the
        failure is then not the call's alone, and the build gives up instead of retrying."""
        if tried.id in self._calls:
            return False
        kernel = next((i for i, k in enumerate(tried.description.kernels) if k.source is None), 0)
        self._calls[tried.id] = _CallFailure(kernel, tried_values(tried), message)
        return True

    def with_call_failures(self, blocks: Iterable[Any], status: Status) -> Status:
        """``status`` (the kernel status a build hands ``compile_plan``) plus an error for each failed
        call that still stands; a failure whose block is gone or whose values changed is forgotten.

        Args:
            blocks: The snapshot's blocks.
            status: ``(block id, kernel index) -> (severity, code, message)``; not changed.
        """
        if not self._calls:
            return status
        by_id = {b.id: b for b in blocks}
        status = dict(status)
        for bid, failure in list(self._calls.items()):
            b = by_id.get(bid)
            if b is None or tried_values(b) != failure.values:
                del self._calls[bid]
                continue
            status[(bid, failure.kernel)] = ("error", DiagnosticCode.LIBRARY_CALL, failure.message)
        return status

    @property
    def failed_calls(self) -> frozenset[int]:
        """Blocks whose library call is left out of the graph now."""
        return frozenset(self._calls)

    # -- what the host sees ------------------------------------------------------------------------
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        """The lost context (an engine error), unbound inputs (warnings), disabled blocks (errors)."""
        lost = (Diagnostic("error", None, DiagnosticCode.GPU_LOST, self.lost),) if self.lost is not None else ()
        return (
            lost
            + tuple(self._lost_inputs.values())
            + tuple(Diagnostic("error", bid, DiagnosticCode.GPU_FAULT, msg) for bid, msg in self._disabled.items())
        )
