"""Specializer: fused kernels recompiled with the values their scalars hold, while those values rest.

A fused group's kernel reads each member's Hot scalars as launch arguments, one constant-bank load
(``LDC``) per scalar and thread. Over a short launch (a 100-block chain of 1,024 floats) those loads
are most of the kernel's time: measured on the H100 host, 1.9 µs a kernel against 1.3 µs for the same
chain with its values compiled in (``cupy.fuse`` of the constants), so the patch ran at 1.26x that peer.
A slider that rests is a constant, so once a group's scalars have held the same values for
``SPECIALIZE_AFTER_S`` (two looks that far apart), its kernel is generated again with those values
compiled in (``ProgramSource.specialized``: ``mov.f32`` of the exact bits, the same results), built on
the kernel builder, and swapped into the running graph by the Code tier between frames
(``CompiledGraph.specialize``, which checks once more that the node runs the code it was made from,
with those values). The node keeps its arguments, so the next Hot (or Warm) patch of one of its scalars
puts the generic kernel back in the same driver call, before the frame that reads the new value
(``CompiledGraph._generalize``): a Hot edit stays Hot, and calls ``arm`` again: the group is
specialised anew once the values rest. A rebind or a growth leaves it specialised (the kernel reads
its pointers, counts and grid as before). A Code swap or a Warm patch that brings new code, and a
specialisation that came too late, arm it too.

Nothing runs per frame: one thread per engine sleeps until armed (a new graph swapped in, a node
generalised, new code), then looks every ``SPECIALIZE_AFTER_S`` until every fused kernel of the running
graph is specialised or submitted for its current code and values.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import CudapatchError
from ..kernels.pacing import FRAME_GUARD, checkpoint
from .compiler.fusion import FUSED_KERNEL
from .garbage import drop_gradually
from .kernels import KernelOutcome

__all__ = ["MAX_SPECIALIZED", "SPECIALIZE_AFTER_S", "Specializer"]

log = logging.getLogger("cudapatch.engine")

#: How long a fused group's scalars must keep their values before its kernel is specialised on them
#: (the values are read twice, this far apart). A slider being dragged changes them every frame.
SPECIALIZE_AFTER_S = 0.25

#: Distinct specialised kernels one engine builds at most. Each is a module loaded for good (a module
#: a retired graph may still run cannot be unloaded safely), so a show whose sliders rest on a new
#: value every few seconds must not grow without bound: past this many the generic kernels run on
#: (logged once). Values that were specialised before are cached and still taken.
MAX_SPECIALIZED = 256

Key = tuple[int, int]


class Specializer:
    """Specialises the running graph's fused kernels on their resting scalar values (module docstring).

    Args:
        graph: Returns the running ``CompiledGraph`` (or None).
        builder: The engine's ``KernelBuilder`` (``submit``).
        ready: Where finished builds go for the frame thread (the ``KernelTracker``'s ``ready`` queue):
            a ``KernelOutcome("specialize", key, compiled, constants, generic)`` each.
    """

    def __init__(self, graph: Callable[[], Any], builder: Any, ready: Any) -> None:
        self._graph = graph
        self._builder = builder
        self._ready = ready
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[Key, tuple[tuple[int, int], ...]] = {}  # values read at the last look
        # The generic source and the values a build was submitted for.
        self._asked: dict[Key, tuple[Any, tuple[tuple[int, int], ...]]] = {}
        # The graph of the last look, weakly: the engine frees a replaced graph a piece at a time
        # (``garbage.drop_gradually``), and a reference held here made its last release, here, one
        # cascade of deallocations (2.3 ms at fused 10,000 blocks on the CPU machine) that held the
        # interpreter from the frames.
        self._graph_seen: weakref.ref | None = None
        self._fused: list[Key] = []  # the fused kernels of ``_graph_seen``
        self._lock = threading.Lock()
        self._made: set[tuple[Key, Any, tuple[tuple[int, int], ...]]] = set()  # distinct builds submitted
        self._full = False  # MAX_SPECIALIZED reached (logged once)

    def arm(self) -> None:
        """Look at the running graph's fused kernels again (a graph was swapped in, a patch put a
        node's generic kernel back, new code came, a specialisation came too late): a flag for the
        thread, which starts on the first call."""
        if self._stop.is_set():
            return
        self._asked = {}  # a node put back to its generic kernel is specialised again, on any values
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(target=self._run, name="cudapatch-specialize", daemon=True)
                    self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (idempotent); builds in flight land in ``ready`` and are ignored there."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.wait(SPECIALIZE_AFTER_S):
                try:
                    again = self.look()
                except Exception as exc:  # a closed graph, a builder that closed: look again when armed
                    log.debug("specializer: %s", exc)
                    again = False
                if not again and not self._wake.is_set():
                    break
                self._wake.clear()

    def look(self) -> bool:
        """One look: submit a specialised build for each fused kernel whose values are those of the last
        look and not yet asked for. Returns whether another look is due (values still moving).

        The code specialised is the one the kernel runs now (``kernel_source``: a member's Code edit
        swaps in a regenerated kernel, the plan's is out of date then); ``specialize`` takes the build
        only while the kernel still runs that code with those values."""
        g = self._graph()
        if g is None or getattr(g, "is_closed", False):
            return False
        with FRAME_GUARD.working():  # a look over 10,000 fused scalars: frames first (``pacing``)
            seen = self._graph_seen
            if seen is None or seen() is not g:  # a new graph: what was seen or asked of the old one is void
                fused = [(n.block_id, n.kernel) for n in g.plan.kernel_nodes if n.kernel == FUSED_KERNEL]
                void = [self._seen, self._asked]  # (the old kernels' sources: freed a piece at a time)
                self._graph_seen, self._fused, self._seen, self._asked = weakref.ref(g), fused, {}, {}
                drop_gradually(void)
            return self._look(g)

    def _look(self, g: Any) -> bool:
        again = False
        for key in self._fused:
            checkpoint()  # (a group's scalars at a time, between frames)
            source = g.kernel_source(key)
            program = getattr(source, "program", None)
            if program is None or not program.scalars:
                continue
            values = g.argument_bits(key, program.scalar_params)
            if values is None:
                continue
            if self._seen.get(key) != values:
                self._seen[key] = values
                again = True
                continue
            asked = self._asked.get(key)
            if (asked is not None and asked[0] is source and asked[1] == values) or g.specialized(key):
                continue
            self._asked[key] = (source, values)
            made = (key, source, values)
            if made not in self._made:
                if len(self._made) >= MAX_SPECIALIZED:
                    if not self._full:
                        self._full = True
                        log.info("specializer: %d kernels specialised; new values run generic", MAX_SPECIALIZED)
                    continue
                self._made.add(made)
            by_scalar = tuple((s, bits) for s, (_, bits) in enumerate(values))
            self._submit(key, source, source.specialized(by_scalar), values)
        return again

    def _submit(self, key: Key, generic: Any, source: Any, values: tuple[tuple[int, int], ...]) -> None:
        try:
            fut = self._builder.submit(source)
        except CudapatchError:  # the builder closed: the engine is closing
            return

        def done(f: Any) -> None:
            if f.cancelled() or f.exception() is not None or self._stop.is_set():
                return  # a failed specialisation changes nothing: the generic kernel runs on
            self._ready.append(KernelOutcome("specialize", key, f.result(), values, generic))

        fut.add_done_callback(done)
