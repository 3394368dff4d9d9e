"""Quiet logs without a GPU: one INFO line per build, one summary line for the blocks downstream of
one that is not running (each block keeps its own diagnostic)."""

from __future__ import annotations

import logging

import pytest

from cudapatch import Diagnostic, DiagnosticCode, Scale
from cudapatch.engine import Context
from cudapatch.engine.board import DiagnosticBoard
from cudapatch.engine.compiler import compile_plan
from cudapatch.engine.diagnostics import DiagnosticLog
from cudapatch.engine.faults import FaultState
from cudapatch.engine.stats import BuildTiming, log_build

LOGGER = "cudapatch.test.quiet"


class NoCompiles:
    diag_version = 0

    def diagnostics(self) -> tuple[Diagnostic, ...]:
        return ()


def _chain(n: int) -> tuple[Context, list[Scale]]:
    c = Context()
    blocks = [c.register_block(Scale(name=f"s{i}")) for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        c.connect(a, "Out", b, "In")
    return c, blocks


def test_a_chain_behind_an_unlinked_block_logs_two_lines_and_keeps_every_diagnostic(caplog) -> None:  # noqa: ANN001
    c, blocks = _chain(80)  # s0's input is not linked: the 79 after it do not run
    plan = compile_plan(c.snapshot())
    board = DiagnosticBoard(c.registry, kernels=NoCompiles(), faults=FaultState(), logger=logging.getLogger(LOGGER))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        board.build_done(plan.diagnostics, plan.block_order)
        board.build_done(plan.diagnostics, plan.block_order)  # the same problems again: nothing new to say
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0] == "block 's0' is not running: required input 'In' is not linked"
    assert lines[1].startswith("79 blocks are not running: an input comes from a block that is not running ('s1', ")
    assert lines[1].endswith("and 71 more) (details on each block)")
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    for b in blocks[1:]:  # the details stay on the blocks
        (d,) = board.of_block(b.id)
        assert d.code is DiagnosticCode.INPUT_NOT_RUNNING and d.code == "input-not-running"
        assert b.debug.message.endswith(f"comes from '{blocks[b.id - blocks[0].id - 1].name}', which is not running")


def test_a_summary_names_what_it_can_and_a_resolved_problem_is_said_again_when_it_returns(caplog) -> None:  # noqa: ANN001
    names = {1: "a", 2: None}
    log = DiagnosticLog(logging.getLogger(LOGGER), names=names.get)
    one = Diagnostic("warning", 1, "input-not-running", "block 'a' is not running: input 'In' comes from 'x', ...")
    two = Diagnostic("warning", 2, "input-not-running", "block '?' is not running: ...")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        log.emit([one])
        log.emit([one, two])
        log.forget({two})
        log.emit([one, two])
    assert [r.getMessage() for r in caplog.records] == [
        "1 block is not running: an input comes from a block that is not running ('a') (details on each block)",
        "1 block is not running: an input comes from a block that is not running (details on each block)",
        "1 block is not running: an input comes from a block that is not running ('a') (details on each block)",
    ]


@pytest.mark.parametrize(
    ("tier", "expected"),
    [
        ("cold", "cold build: 12.5 ms (plan 4.0, realize 8.0), 98 of 100 blocks running"),
        ("warm-resize", "warm-resize build: 12.5 ms (plan 4.0, realize 8.0), 98 of 100 blocks running"),
        ("deferred", None),
        ("", None),
    ],
)
def test_one_info_line_per_build(caplog, tier: str, expected: str | None) -> None:  # noqa: ANN001
    t = BuildTiming(tier=tier, compile_ms=4.0, realize_ms=8.0, total_ms=12.5)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        log_build(logging.getLogger(LOGGER), t, running=98, total=100)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == ([(logging.INFO, expected)] if expected else [])
