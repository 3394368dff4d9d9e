"""KernelTracker: the engine's view of every kernel instance ``(block_id, kernel index)``.

It asks the background ``KernelBuilder`` for compiles, keeps the last good result of each kernel
(which keeps running while an edit is broken or still compiling), watches kernel files, and turns
finished compiles into outcomes for the engine: swap a function in place (Code tier), rebuild
(Cold), or re-describe a block whose file changed its signature.

Compiles finish on the builder's service thread, between frames. A swap is done right there by
the engine's ``swapper`` when it can take the graph without waiting for the frame thread; every
other outcome waits in ``ready`` for the next ``Engine.update()``. A compiled kernel whose source
names an ``upgrade()`` (an Expression's kernel, JITted fast so that an edit runs at once) has that
optimised build compiled next and swapped in the same way (an ``upgrade`` outcome).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import CudapatchError, KernelCompileError, KernelLoadError
from ..kernels.builder import CompiledKernel, KernelBuilder
from ..kernels.module_cache import ModuleCache
from ..kernels.source import KernelSource
from ..kernels.watch import FileWatcher
from .context import BlockSnapshot, PatchSnapshot
from .diagnostics import Diagnostic, DiagnosticCode, Severity

__all__ = ["KernelTracker", "KernelOutcome"]

log = logging.getLogger("cudapatch.engine")

#: How long a quick build (an Expression's edit, live at once) runs before its optimised build starts.
#: The builder does one thing at a time, and the optimised JIT takes 11 ms (H100 host): started at
#: once, it held up the next edit's quick build (0.3 ms) while a user typed or dragged, so edits went
#: live in 12-15 ms instead of 1.5 ms. Edits closer together than this never wait for one.
UPGRADE_AFTER_S = 0.25

#: Blocks ``KernelTracker.resolve`` looks at per hold of the tracker's lock.
RESOLVE_CHUNK = 256


def after_settling(fn: Callable[[], None]) -> None:
    """Call ``fn`` on a timer thread after ``UPGRADE_AFTER_S`` (it checks whether it is still wanted);
    at once, on this thread, when that is 0."""
    if UPGRADE_AFTER_S <= 0:
        fn()
        return
    t = threading.Timer(UPGRADE_AFTER_S, fn)
    t.daemon = True
    t.start()


Key = tuple[int, int]


@dataclass
class _Slot:
    source: KernelSource
    block_name: str
    generation: int = 0  # bumped by file edits: the same source object, new content
    requested: int = -1
    future: Future | None = None
    good: CompiledKernel | None = None
    error: Exception | None = None
    fits: Any = field(default=None, repr=False)  # the spec descriptor ``good`` was checked against
    made: int = 0  # ``KernelTracker.edits`` when a code edit made it (``source_changed``); 0 otherwise


@dataclass(frozen=True)
class KernelOutcome:
    """What a finished compile asks of the engine."""

    # swapped: done between frames; republish. upgrade: an optimised build of the running kernel (a
    # swap where the kernel runs; nothing, never a rebuild, where it does not). specialize: a fused
    # kernel, its ``generic`` source built with ``constants`` ((argument index, float32 bits)) compiled
    # in (``specialize.py``)
    action: Literal["swap", "swapped", "rebuild", "refresh", "upgrade", "specialize"]
    key: Key
    compiled: CompiledKernel | None = None
    constants: tuple[tuple[int, int], ...] = ()
    generic: Any = None


def _forward(src: Future, dst: Future) -> None:
    if dst.done():
        return
    if src.cancelled():  # the engine closed before the compile ran
        dst.cancel()
        return
    exc = src.exception()
    if exc is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())


def _message(exc: Exception) -> str:
    msg = str(exc)
    log_text = getattr(exc, "log", "")
    if log_text:
        lines = log_text.strip().splitlines()
        # The log's first lines, then each later error's own line (the editor marks every one at its line).
        later = [ln for ln in lines[6:] if _LOG_ERROR.search(ln)][:_MAX_LATER_ERRORS]
        excerpt = "\n".join(lines[:6] + later)
        msg += f"\n{excerpt}"
    return msg


# NVRTC's "k.cu(12): error: ..." and ptxas's "ptxas ..., line 12; error   : ..."
_LOG_ERROR = re.compile(r"\(\d+\): (?:catastrophic )?error|, line \d+; error")
_MAX_LATER_ERRORS = 20


class KernelTracker:
    """Compile state of every kernel instance of one engine.

    Args:
        builder: The background compiler.
        watch_files: Watch file-based sources and recompile on edits.
        swapper: Applies a swap outcome from the builder's thread right after a frame (the engine's
            Code tier); returns False to leave it to the frame thread. None: every outcome waits in
            ``ready``.
    """

    def __init__(
        self,
        builder: KernelBuilder,
        *,
        watch_files: bool = True,
        swapper: Callable[[KernelOutcome], bool] | None = None,
    ) -> None:
        self.builder = builder
        self.watcher: FileWatcher | None = FileWatcher() if watch_files else None
        self._slots: dict[Key, _Slot] = {}
        #: Code edits seen (``source_changed``): a build notes it before its snapshot, and ``resolve``
        #: keeps a slot an edit made after it rather than going back to the snapshot's older source.
        self.edits = 0
        self.pending: list[Key] = []  # keys with a compile in flight
        # Requests not yet handed over (``flush``): a deque, so the frame thread and a build on the build
        # thread can both hand them over (each request is popped by one of them) without a lock.
        self.to_submit: deque[tuple[Key, _Slot, Future]] = deque()
        #: Finished compiles for the frame thread (the frame path tests this deque).
        self.ready: deque[KernelOutcome] = deque()
        #: Applies a swap outcome from the builder's thread; returns False to leave it to the frame thread.
        self.swapper = swapper
        self._diags: dict[Key, Diagnostic] = {}
        self.diag_version = 0  # bumped whenever the compile diagnostics change
        self._saved_switch: float | None = None
        # Frame thread (edits, rebuilds) and builder thread (finished compiles) share the slots.
        self._lock = threading.RLock()

    # -- requests --------------------------------------------------------------------------------
    def _request(self, key: Key, slot: _Slot) -> None:
        if slot.requested == slot.generation and slot.future is not None:
            return
        if not self.pending:
            self._fast_switch(True)
        slot.requested = slot.generation
        slot.future = Future()  # completed once the builder's result is settled (see ``_finished``)
        self.to_submit.append((key, slot, slot.future))
        if key not in self.pending:
            self.pending.append(key)

    def await_compiles(self, keys: Iterable[Key], timeout: float) -> None:
        """On the build thread: hand queued requests to the builder and wait up to ``timeout`` seconds
        for the compiles of ``keys`` (a kernel in the memory or disk cache lands within a frame, so a
        new block runs in the graph of the build that first includes it)."""
        self.flush()
        with self._lock:
            futures = [s.future for k in keys if (s := self._slots.get(k)) and s.future is not None]
        if futures:
            wait_futures(futures, timeout=timeout)

    def take_cached(self, keys: Iterable[Key]) -> int:
        """For kernels waiting for a compile (``keys``) whose source is in the memory or disk cache:
        load them on the calling thread now and settle them as if the builder had (its later result
        for the same request is then ignored). A build calls this so that a kernel compiled before
        runs in the first build that includes it. Returns how many were taken; an outcome the frame
        thread must act on (a swap into the running graph) is queued in ``ready``.
        """
        taken = 0
        with self._lock:
            for key in keys:
                slot = self._slots.get(key)
                if slot is None or slot.future is None:
                    continue
                try:
                    compiled = self.builder.build_cached(slot.source)
                except CudapatchError:  # the builder's own attempt reports it
                    continue
                if compiled is None:
                    continue
                slot.future = None  # supersedes the request in flight (``_finished`` ignores its result)
                if key in self.pending:
                    self.pending.remove(key)
                done: Future = Future()
                done.set_result(compiled)
                outcome = self._settle(key, slot, done)
                if outcome.action in ("swap", "refresh"):
                    self.ready.append(outcome)
                taken += 1
            if taken and not self.pending:
                self._fast_switch(False)
        return taken

    def flush(self) -> None:
        """Hand queued compile requests to the builder. The engine calls this after the frame's launch;
        a build on the build thread calls it under the tracker's lock (``await_compiles``)."""
        queued = self.to_submit
        while queued:
            try:
                key, slot, proxy = queued.popleft()
            except IndexError:  # the other thread took the last one
                break
            try:
                real = self.builder.submit(slot.source)
            except KernelLoadError as exc:
                real = Future()
                real.set_exception(exc)
            real.add_done_callback(lambda f, k=key, s=slot, p=proxy: self._finished(k, s, p, f))

    def _finished(self, key: Key, slot: _Slot, proxy: Future, result: Future) -> None:
        """A compile completed (on the builder's thread): settle it, swap it in or queue the outcome."""
        outcome = None
        with self._lock:
            if self._slots.get(key) is slot and slot.future is proxy:  # else a newer edit superseded it
                slot.future = None
                if key in self.pending:
                    self.pending.remove(key)
                version = self.diag_version
                outcome = self._settle(key, slot, result)
                if not self.pending:
                    self._fast_switch(False)
        if outcome is not None:
            if outcome.action == "swap" and self.swapper is not None and self.swapper(outcome):
                if self.diag_version != version:  # an error cleared: the engine republishes
                    self.ready.append(KernelOutcome("swapped", key, outcome.compiled))
            else:
                self.ready.append(outcome)
            if outcome.compiled is not None:
                self._upgrade(key, slot, outcome.compiled)
        _forward(result, proxy)  # last: whoever waits on the proxy finds the outcome queued

    def _upgrade(self, key: Key, slot: _Slot, compiled: CompiledKernel) -> None:
        """``compiled`` runs (or is about to): compile its source's ``upgrade()`` (an optimised build of
        the same kernel) and swap that in the same way, unless a newer compile of the kernel lands
        first. Same descriptor, so always a swap. The optimised build starts once the kernel has run
        ``UPGRADE_AFTER_S`` without a newer edit (see there)."""
        better = compiled.source.upgrade()
        if better is None:
            return

        def submit() -> None:
            with self._lock:
                current = self._slots.get(key)
                if current is None or current.good is not compiled:  # edited again meanwhile: its turn
                    return
            try:
                fut = self.builder.submit(better)
            except KernelLoadError:  # the builder closed: the engine is closing
                return
            fut.add_done_callback(lambda f: self._upgraded(key, slot, compiled, f))

        after_settling(submit)

    def _upgraded(self, key: Key, slot: _Slot, quick: CompiledKernel, fut: Future) -> None:
        """The optimised build of ``quick`` is done: it replaces ``quick`` wherever that still runs."""
        # On the builder's thread. A failed upgrade (or one the closing builder drops) leaves the quick
        # build running: it computes the same bits, so nothing is reported on the block.
        if fut.cancelled() or fut.exception() is not None:
            if not fut.cancelled():
                log.debug("optimised build of %s failed, the quick one runs on: %s", slot.block_name, fut.exception())
            return
        better: CompiledKernel = fut.result()
        with self._lock:
            current = self._slots.get(key)  # a later edit's slot keeps the running build as its fallback
            if current is None or current.good is not quick:  # a newer compile runs: this one is out of date
                return
            current.good = better
        outcome = KernelOutcome("upgrade", key, better)
        if self.swapper is None or not self.swapper(outcome):
            self.ready.append(outcome)

    def _settle(self, key: Key, slot: _Slot, fut: Future) -> KernelOutcome:
        if fut.cancelled():
            fut = Future()
            fut.set_exception(KernelLoadError("the compile was cancelled", kernel=slot.source.debug_name))
        exc = fut.exception()
        if exc is not None:
            if not isinstance(exc, CudapatchError):
                exc = KernelCompileError(f"{type(exc).__name__}: {exc}", kernel=slot.source.debug_name)
            if exc.block is None:
                exc.block = slot.block_name
            slot.error = exc
            keeps = " (the previous version keeps running)" if slot.good is not None else ""
            self._diags[key] = Diagnostic("error", key[0], DiagnosticCode.KERNEL_COMPILE, _message(exc) + keeps)
            self.diag_version += 1
            return KernelOutcome("rebuild", key)  # so a block that cannot run says why
        compiled: CompiledKernel = fut.result()
        slot.error = None
        if self._diags.pop(key, None) is not None:
            self.diag_version += 1
        previous = slot.good
        slot.good, slot.fits = compiled, None
        if previous is None:
            return KernelOutcome("rebuild", key, compiled)
        if previous.descriptor == compiled.descriptor:
            return KernelOutcome("swap", key, compiled)
        return KernelOutcome("refresh", key, compiled)

    def _slot(self, key: Key, source: KernelSource, block_name: str, since: int | None = None) -> _Slot:
        slot = self._slots.get(key)
        if slot is not None and since is not None and slot.made > since and slot.source != source:
            return slot  # a code edit made after the snapshot (``since``): it stays; the build runs its fallback
        if slot is None or (slot.source is not source and slot.source != source):  # (`is`: a dataclass `==` costs µs)
            new = _Slot(source, block_name)
            if slot is not None:
                new.good = slot.good  # the running version stays the fallback while the new one compiles
            slot = new
            self._slots[key] = slot
            self._request(key, slot)
            if self.watcher is not None:
                files = source.watched_files()
                if files:
                    self.watcher.watch(key, files)
                else:
                    self.watcher.unwatch(key)
        return slot

    def source_changed(self, key: Key, source: KernelSource, block_name: str) -> None:
        """A kernel's code changed (new source object, or same source with new file content)."""
        with self._lock:
            slot = self._slots.get(key)
            self.edits += 1
            if slot is not None and slot.source == source:
                slot.generation += 1
                self._request(key, slot)
            else:
                self._slot(key, source, block_name).made = self.edits

    def file_events(self) -> list[Key]:
        """Kernels whose files changed (debounced); each gets a recompile. Never blocks."""
        if self.watcher is None or not self.watcher.ready:
            return []
        with self._lock:
            keys = [k for k in self.watcher.events() if k in self._slots]
            for key in keys:
                slot = self._slots[key]
                slot.generation += 1
                self._request(key, slot)
        return keys

    # -- for a rebuild -----------------------------------------------------------------------------
    def resolve(
        self, snap: PatchSnapshot, since: int | None = None
    ) -> tuple[dict[Key, Any], dict[Key, tuple[Severity, str, str]]]:
        """For every kernel of the patch: its function if a compiled version fits the block's
        description, else why it cannot run yet. Requests compiles for new or changed sources.
        ``since``: ``edits`` before ``snap`` was taken; a kernel whose code was edited after keeps the
        edit's compile (the build runs the version that ran before it; the edit's is swapped in when
        it lands) instead of compiling the snapshot's older code again.

        The tracker's lock is taken for ``RESOLVE_CHUNK`` blocks at a time: a compile that lands meanwhile
        settles between two chunks. Held for a whole 10,000-block patch (2-4 ms on the build thread), it
        held up the frame thread, whose compile requests settle at once on a cache hit (CPU machine,
        ``benchmarks/bench_swap_cpu.py``).
        """
        functions: dict[Key, Any] = {}
        status: dict[Key, tuple[Severity, str, str]] = {}
        live: set[Key] = set()
        blocks = iter(snap.blocks)
        while True:
            chunk = list(itertools.islice(blocks, RESOLVE_CHUNK))
            if not chunk:
                break
            with self._lock:
                self._resolve(chunk, functions, status, live, since)
        dead = [k for k in list(self._slots) if k not in live]  # (a C-level copy: no lock needed)
        for i in range(0, len(dead), RESOLVE_CHUNK):
            with self._lock:
                for key in dead[i : i + RESOLVE_CHUNK]:
                    if self._slots.pop(key, None) is not None:
                        self._diags.pop(key, None)
                        if self.watcher is not None:
                            self.watcher.unwatch(key)
        return functions, status

    def resolve_again(
        self,
        snap: PatchSnapshot,
        keys: Iterable[Key],
        resolved: tuple[dict[Key, Any], dict[Key, tuple[Severity, str, str]]],
        since: int | None = None,
    ) -> tuple[dict[Key, Any], dict[Key, tuple[Severity, str, str]]]:
        """``resolve`` again for the blocks of ``keys`` only (kernels that were compiling when
        ``resolved`` was made, taken from the cache or awaited since): what ``resolve(snap)`` returns
        now, without going over every block again (2 to 7 ms at 1,000 blocks on the H100 host)."""
        ids = {k[0] for k in keys}
        functions = {k: f for k, f in resolved[0].items() if k[0] not in ids}
        status = {k: v for k, v in resolved[1].items() if k[0] not in ids}
        blocks = [b for b in snap.blocks if b.id in ids]
        with self._lock:
            self._resolve(blocks, functions, status, set(), since)
        return functions, status

    def _resolve(
        self,
        blocks: list[BlockSnapshot],
        functions: dict[Key, Any],
        status: dict[Key, tuple[Severity, str, str]],
        live: set[Key],
        since: int | None,
    ) -> None:
        for b in blocks:
            for ki, spec in enumerate(b.description.kernels):
                if spec.source is None:  # a captured library call: nothing to compile
                    continue
                key = (b.id, ki)
                live.add(key)
                slot = self._slot(key, spec.source, b.name, since)
                good = slot.good
                if good is not None and (slot.fits is spec.descriptor or good.descriptor == spec.descriptor):
                    slot.fits = spec.descriptor
                    functions[key] = good.function
                elif slot.error is not None and key not in self.pending:
                    status[key] = ("error", DiagnosticCode.KERNEL_COMPILE, _message(slot.error))
                else:
                    status[key] = (
                        "info",
                        DiagnosticCode.KERNEL_COMPILING,
                        f"compiling kernel '{spec.descriptor.entry_point}'",
                    )

    # -- results -----------------------------------------------------------------------------------
    def collect(self, *, wait: bool = False, timeout: float | None = None) -> list[KernelOutcome]:
        """Take the finished compiles the frame thread must act on (waiting for all in flight if ``wait``).

        Returns:
            What the engine should do: swap functions, rebuild, re-describe blocks, republish.
        """
        if self.to_submit:
            self.flush()
        if wait and self.pending:
            with self._lock:
                futures = [s.future for k in self.pending if (s := self._slots.get(k)) and s.future is not None]
            with self.builder.unpaced():
                wait_futures(futures, timeout=timeout)
        ready, outcomes = self.ready, []
        while ready:
            outcomes.append(ready.popleft())
        return outcomes

    def reload(self, modules: ModuleCache) -> None:
        """The context was reset: load every kept kernel again from its compiled image into ``modules``
        (the new context's), and compile into it from now on. A kernel that fails to load is dropped
        with its error (it compiles again at its next edit)."""
        with self._lock:
            self.builder.modules = modules
            for slot in self._slots.values():  # cubins survive a reset; their loaded functions do not
                if slot.good is not None:
                    try:
                        slot.good = dataclasses.replace(slot.good, function=modules.function(slot.good.image))
                    except CudapatchError as exc:
                        slot.good, slot.error = None, exc

    def _fast_switch(self, on: bool) -> None:
        # While compiles are in flight, worker threads run some Python (cache lookups, module loads).
        # The interpreter hands the GIL back every switch interval (5 ms by default). Measured on the
        # H100 host with compiles in the compiler process: the default gives the smallest frame
        # stalls (0.35 ms worst during a 20-edit burst; 0.1-0.5 ms intervals gave 0.5-0.9 ms), so it
        # is left alone unless CUDAPATCH_GIL_SWITCH_US asks otherwise.
        us = float(os.environ.get("CUDAPATCH_GIL_SWITCH_US", "0"))
        if on and self._saved_switch is None and us > 0:
            self._saved_switch = sys.getswitchinterval()
            sys.setswitchinterval(min(self._saved_switch, us * 1e-6))
        elif not on and self._saved_switch is not None:
            sys.setswitchinterval(self._saved_switch)
            self._saved_switch = None

    def running(self, key: Key) -> CompiledKernel | None:
        """The last good build of a kernel (what runs, or will at the next swap or build), or None."""
        with self._lock:
            slot = self._slots.get(key)
            return None if slot is None else slot.good

    def compiling(self) -> frozenset[int]:
        """Ids of the blocks with a kernel compile in flight: a first compile, or an edit's while the
        previous version keeps running (not an optimised build of a running kernel). For displays (the
        node editor's Compiling state); read without the lock, from a copy of ``pending``."""
        return frozenset(key[0] for key in tuple(self.pending))

    def diagnostics(self) -> tuple[Diagnostic, ...]:
        """Compile errors that persist until the kernel compiles again."""
        return tuple(self._diags.values())

    def close(self) -> None:
        """Stop watching and compiling; idempotent."""
        self._fast_switch(False)
        if self.watcher is not None:
            self.watcher.close()
        self.builder.close()
