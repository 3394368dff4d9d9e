"""Diagnostics: problems found while compiling or running, attached to the block that caused them.

A host shows them on its operators and matches on their ``code``. The codes are a closed set,
``DiagnosticCode``: a ``str`` enum, so a host that compares ``d.code == "gpu-fault"`` or keys a dict
by the plain string keeps working, while code inside cudapatch names them and a typo fails at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

__all__ = ["SUMMARISED", "Diagnostic", "DiagnosticCode", "DiagnosticLog", "Severity"]

Severity = Literal["error", "warning", "info"]
_LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO}


class DiagnosticCode(StrEnum):
    """Every code a diagnostic of the engine carries. Members compare and hash equal to their text
    (``DiagnosticCode.GPU_FAULT == "gpu-fault"``) and print as it."""

    # Validation of the patch (the graph compiler): the block does not run.
    CROSS_ENGINE = "cross-engine"  # a block or link of another engine
    UNKNOWN_PORT = "unknown-port"
    TYPE_MISMATCH = "type-mismatch"  # a link between ports of different element types
    DUPLICATE_LINK = "duplicate-link"  # two links into one input
    CYCLE = "cycle"  # a loop that does not pass through a FrameDelay (each block of it, naming the loop)
    # FrameDelay feedback (``compiler/delays.py``).
    DELAY_MISMATCH = "delay-mismatch"  # In's size or source does not fit the delay: an error on it
    DELAY_CAPTURED = "delay-captured"  # a library call reads or writes a delay's alternating buffers
    DELAY_OPEN = "delay-open"  # warning: nothing computes In (Out keeps its start value)
    DELAY_REGION = "delay-region"  # a FrameDelay in a region whose Init is made inside that region
    # Blocks left out of the graph (warnings unless the cause is an error of the block itself).
    INPUT_UNLINKED = "input-unlinked"  # a required input has no link and no binding
    INPUT_NOT_RUNNING = "input-not-running"  # an input comes from a block that is not running
    INPUT_FAULTED = "input-faulted"  # an input reads zeros from a block disabled by a GPU fault
    LIBRARY_SHAPE = "library-shape"  # a captured call refuses its input sizes
    # Shapes (errors: the block never launches; ``engine.compiler.shapes``).
    SHAPE_UNRESOLVED = "shape-unresolved"  # a size rule or launch whose shape cannot be found
    INPUT_SHORT = "input-short"  # an input holds fewer elements than a kernel's launch reads
    INPUT_SHAPE = "input-shape"  # an input's axes differ from those a 2-D/3-D launch reads
    INPUT_SIZE = "input-size"  # an input's length fits no broadcasting rule of the kernel (an Expression's)
    # Regions (If, While, For).
    REGION_PARENT = "region-parent"  # a block placed in something that is not a region of the patch
    REGION_MAX = "region-max"  # a While without Max; per frame (warning): a While ran Max iterations
    REGION_CONDITION = "region-condition"  # no Condition, or one from a block that cannot decide it
    REGION_NOT_RUNNING = "region-not-running"  # left out: its condition's block or its region does not run
    # Kernels.
    KERNEL_COMPILE = "kernel-compile"  # compile or load failed (message carries the compiler log)
    KERNEL_COMPILING = "kernel-compiling"  # info: not running yet, its first compile is in flight
    KERNEL_SIGNATURE = "kernel-signature"  # a file edit changed the signature and re-describing failed
    # warning: a declaration about a block's expression does not hold (an Expression's declared name its
    # code does not use; a plugin's ``k.elementwise`` that does not parse or fit its ports: runs unfused)
    EXPRESSION_DECLARATION = "expression-declaration"
    # Building and running the graph.
    LIBRARY_CALL = "library-call"  # a captured library call failed to capture
    REALIZE = "realize"  # a driver call failed while building the graph
    OUT_OF_MEMORY = "out-of-memory"  # the patch needs more device memory than is free: not built
    LAUNCH = "launch"  # the graph launch failed (not a sticky fault)
    BYPASS = "bypass"  # warning: a bypassed block's nodes cannot be turned off in place (it keeps running)
    CHILD_GRAPH = "child-graph"  # a composite asked for a child graph and runs flattened instead (why)
    # Sticky GPU faults (``engine.recovery``).
    GPU_FAULT = "gpu-fault"  # this block's kernel faulted: disabled until its code changes
    GPU_LOST = "gpu-lost"  # CUDA refuses the process after a fault: restart it
    BINDING_LOST = "binding-lost"  # an external input's memory died with the context: bind it again
    # Measurements (profiling levels that read them).
    LOW_OCCUPANCY = "low-occupancy"  # a kernel keeps few of an SM's threads busy
    APPEND_FULL = "append-full"  # per frame: an append output is nearly full
    PROBE = "probe"  # warning: a probed output cannot be read (no probe node for it; why)


_CODES: dict[str, DiagnosticCode] = {c.value: c for c in DiagnosticCode}


@dataclass(frozen=True)
class Diagnostic:
    """One problem.

    Attributes:
        severity: ``error`` (block does not run), ``warning`` (runs or is skipped), ``info``.
        block_id: The block it belongs to, None for the engine itself.
        code: Stable machine-readable code, a ``DiagnosticCode`` (given as one or as its text; a text
            that is no code of the engine stays a plain string, for hosts that make their own).
        message: Human-readable text naming block, port, parameter, file and line as applicable.
    """

    severity: Severity
    block_id: int | None
    code: DiagnosticCode | str
    message: str

    def __post_init__(self) -> None:
        if not isinstance(self.code, DiagnosticCode):
            code = _CODES.get(self.code)
            if code is not None:
                object.__setattr__(self, "code", code)  # frozen: the one way to normalise a field

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}"


#: Codes logged as one summary line per publish instead of one line each: the blocks downstream of
#: one that is not running (80 lines at the start of a 100-operator patch whose kernels compile).
#: Each block still carries its own diagnostic.
SUMMARISED = frozenset({DiagnosticCode.INPUT_NOT_RUNNING})
_NAMED_IN_SUMMARY = 8  # block names a summary line lists before "and N more"


class DiagnosticLog:
    """Logs each distinct diagnostic once (no log spam when the same problem persists every frame);
    the new diagnostics of a ``SUMMARISED`` code become one line together."""

    def __init__(self, logger: logging.Logger, names: Callable[[int], str | None] | None = None) -> None:
        self._logger = logger
        self._names = names or (lambda block_id: None)
        self._seen: set[Diagnostic] = set()

    def emit(self, diags: tuple[Diagnostic, ...] | list[Diagnostic]) -> None:
        """Log every diagnostic not logged since it was last forgotten."""
        quiet: list[Diagnostic] = []
        for d in diags:
            if d not in self._seen:
                self._seen.add(d)
                if d.code in SUMMARISED:
                    quiet.append(d)
                else:
                    self._logger.log(_LEVELS[d.severity], "%s", d.message)
        if quiet:
            self._summarise(quiet)

    def _summarise(self, diags: list[Diagnostic]) -> None:
        names = [self._names(d.block_id) if d.block_id is not None else None for d in diags]
        shown = [f"'{n}'" for n in names if n][:_NAMED_IN_SUMMARY]
        more = len(diags) - len(shown)
        listed = ", ".join(shown) + (f" and {more} more" if shown and more else "")
        level = max(_LEVELS[d.severity] for d in diags)
        blocks = "1 block is" if len(diags) == 1 else f"{len(diags)} blocks are"
        self._logger.log(
            level,
            "%s not running: an input comes from a block that is not running%s (details on each block)",
            blocks,
            f" ({listed})" if listed else "",
        )

    def forget(self, keep: set[Diagnostic]) -> None:
        """Forget resolved diagnostics so they are logged again if they come back."""
        self._seen &= keep
