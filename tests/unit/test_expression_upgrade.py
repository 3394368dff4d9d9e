"""Live first, optimised next: an Expression's kernel is JITted at a low level so an edit runs at
once, then its optimised build is compiled and swapped in (``ProgramSource.upgrade``, the
``KernelTracker``'s ``upgrade`` outcome). Driven by a stand-in builder whose compiles the test
finishes, in the order it chooses; the driver side runs on the GPU (tests/gpu/test_expression_gpu.py)."""

from __future__ import annotations

from concurrent.futures import Future
from contextlib import nullcontext
from typing import Any

import pytest

from cudapatch import Expression
from cudapatch.engine import Context
from cudapatch.engine.kernels import KernelTracker
from cudapatch.expr import ProgramSource, compile_expression, single
from cudapatch.expr.source import QUICK_JIT_LEVEL
from cudapatch.kernels.builder import CompiledKernel


class HeldBuilder:
    """Holds every request until the test finishes it (compiling for real: PTX generation is CPU work)."""

    def __init__(self) -> None:
        self.requests: list[tuple[Any, Future]] = []

    def submit(self, source: Any) -> Future:
        f: Future = Future()
        self.requests.append((source, f))
        return f

    def finish(self, i: int) -> CompiledKernel:
        source, f = self.requests[i]
        done = CompiledKernel(source, source.compile("sm_90"), object(), "compiled", 0.0)
        f.set_result(done)
        return done

    def unpaced(self) -> nullcontext:
        return nullcontext()


@pytest.fixture(autouse=True)
def _upgrade_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimised build starts when the quick one lands (in the engine it waits for edits to settle)."""
    from cudapatch.engine import kernels as kernels_module

    monkeypatch.setattr(kernels_module, "UPGRADE_AFTER_S", 0)


def _program(text: str = "x * Gain + 0.5"):
    return single(compile_expression(text))


def test_a_quick_source_jits_at_the_quick_level_and_upgrades_to_the_same_text(monkeypatch) -> None:
    from cudapatch.expr.bytecode import INTERPRETERS

    monkeypatch.setattr(INTERPRETERS, "get", lambda *a, **k: None)  # the interpreter is not compiled yet
    quick = ProgramSource.of(_program(), jit="quick")
    full = quick.upgrade()
    assert full is not None and full.jit == "full" and full.upgrade() is None
    assert full.describe() == quick.describe() and full != quick
    assert full.cache_key("sm_90") != quick.cache_key("sm_90")  # two cache entries, two modules
    a, b = quick.compile("sm_90"), full.compile("sm_90")
    # The quick build is the PTX for the driver's JIT at the quick level; the upgrade, the same PTX
    # linked to a cubin by nvJitLink at its default level (the driver JITs nothing).
    assert a.kind == "ptx" and a.image == quick.code("sm_90").encode() + b"\0" == full.code("sm_90").encode() + b"\0"
    assert b.kind == "cubin" and a.jit_level == QUICK_JIT_LEVEL and b.jit_level is None and a.key != b.key
    assert ProgramSource.of(_program(), backend="nvrtc", jit="quick").jit == "full"  # NVRTC: one build
    assert ProgramSource.of(_program()).upgrade() is None


def test_an_expression_block_builds_quick_sources() -> None:
    c = Context()
    ex = c.register_block(Expression(name="ex", Code="x * Gain"))
    assert ex.source.jit == "quick"
    assert ex.text_source("Code", "x * Gain + 1")[1].jit == "quick"  # type: ignore[index, union-attr]
    nv = c.register_block(Expression(name="nv", Code="x * Gain", Compiler="nvrtc"))
    assert nv.source.jit == "full" and nv.source.upgrade() is None


def _tracked() -> tuple[HeldBuilder, KernelTracker, Context, Expression]:
    """An Expression block ``x * Gain`` whose kernel the tracker has resolved and asked ``HeldBuilder``
    for (request 0: its quick build)."""
    b = HeldBuilder()
    t = KernelTracker(b, watch_files=False)  # type: ignore[arg-type]
    c = Context()
    ex = c.register_block(Expression(name="ex", Code="x * Gain"))
    t.resolve(c.snapshot())
    t.flush()
    return b, t, c, ex


def test_the_optimised_build_follows_each_compile_and_a_newer_edit_supersedes_it() -> None:
    b, t, c, ex = _tracked()
    key = (ex.id, 0)
    ((source, _),) = b.requests
    assert source.jit == "quick"
    quick = b.finish(0)
    (o,) = t.collect()
    assert o.action == "rebuild" and o.compiled is quick
    assert len(b.requests) == 2 and b.requests[1][0] == source.upgrade()  # the optimised build is asked for
    better = b.finish(1)
    (o,) = t.collect()
    assert o.action == "upgrade" and o.compiled is better
    functions, status = t.resolve(c.snapshot())
    assert functions[key] is better.function and not status

    # an edit: its quick build swaps; a newer edit's quick build that lands first wins
    ex.set("Code", "x * Gain + 1")
    t.source_changed(key, ex.description.kernels[0].source, ex.name)
    t.flush()
    assert b.requests[2][0].jit == "quick"
    b.finish(2)
    (o,) = t.collect()
    assert o.action == "swap"
    assert b.requests[3][0].jit == "full"
    ex.set("Code", "x * Gain + 2")
    t.source_changed(key, ex.description.kernels[0].source, ex.name)
    t.flush()
    newest = b.finish(4)
    (o,) = t.collect()
    assert o.action == "swap" and o.compiled is newest
    b.finish(3)  # the first edit's optimised build: out of date, dropped
    assert t.collect() == []
    b.finish(5)
    (o,) = t.collect()
    assert o.action == "upgrade" and "x * Gain + 2" in o.compiled.source.program.summary()
    functions, _ = t.resolve(c.snapshot())
    assert functions[key] is o.compiled.function


def test_the_optimised_build_still_lands_when_a_broken_edit_came_before_it() -> None:
    b, t, c, ex = _tracked()
    key = (ex.id, 0)
    b.finish(0)
    t.collect()
    ex.set("Code", "x * (Gain +")  # a typo: fails on the builder, the quick build keeps running
    t.source_changed(key, ex.description.kernels[0].source, ex.name)
    t.flush()
    source, fut = b.requests[2]
    try:
        source.compile("sm_90")
    except Exception as exc:  # the ExpressionError the builder would report
        fut.set_exception(exc)
    (o,) = t.collect()
    assert o.action == "rebuild" and t.diagnostics()
    better = b.finish(1)  # the optimised build of what still runs
    (o,) = t.collect()
    assert o.action == "upgrade" and o.compiled is better
    functions, _ = t.resolve(c.snapshot())
    assert functions[key] is better.function


def test_a_failed_optimised_build_leaves_the_quick_build_running() -> None:
    b, t, c, ex = _tracked()
    quick = b.finish(0)
    t.collect()
    b.requests[1][1].set_exception(RuntimeError("the driver refused it"))
    assert t.collect() == []
    functions, _ = t.resolve(c.snapshot())
    assert functions[(ex.id, 0)] is quick.function
