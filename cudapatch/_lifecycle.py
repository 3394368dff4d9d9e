"""One lifecycle for every object that owns CUDA driver or GL handles.

An *owner* is an object that holds something the CUDA driver or a GL context must be told to give
back: device or pinned memory, events, streams, modules, surface objects, graphics registrations,
executable graphs, GL buffers, textures, queries, programs, vertex arrays. Every owner follows the
``Lifecycle`` protocol, most of them through the ``HandleOwner`` mixin:

- ``close()`` gives everything back. It is idempotent: a second call does nothing. Using an owner
  after ``close()`` raises a ``CudapatchError`` (the subclass of its package: ``InteropError`` for
  GL interop objects) that names the owner, never a driver error about a stale handle or a fault
  on freed memory. The frame path stays free of checks: ``CompiledGraph.launch`` and its Hot and
  Warm updates look at ``is_closed`` only after the driver refused, ``DeviceContext.make_current``
  only when it has to make the context current.
- ``is_closed`` says whether it was closed (or abandoned).
- An owner is a context manager: ``with ImportedRing(n) as ring: ...`` closes it on exit,
  exception or not.
- ``abandon()`` forgets every handle *without calling the driver*: for the objects of a CUDA
  context that is gone (a sticky fault and ``cuDevicePrimaryCtxReset``, see
  ``engine/recovery.py``), where every release call would fail or, worse, free an address that a
  new allocation of the fresh context now holds. An abandoned owner is closed.

Finalizer policy (the safety net for an owner nobody closed):

- Owners register a ``weakref.finalize`` (``HandleOwner._arm``), never ``__del__`` (a ``__del__``
  runs on a half-torn-down object, can resurrect it, and chains of them run in an order nobody
  chose). The finalizer holds the handles, never the owner; ``close()`` and ``abandon()`` detach it.
- The finalizer of an owner a user makes and may forget emits a ``ResourceWarning`` naming it: a
  leak is a bug in the caller (Python's own unclosed files warn the same way; the warning is
  silent unless warnings are enabled, and the test suite turns it into an error).
- The parts of an engine are closed by the engine, always (``DeviceResources.close``; ``abandon``
  after a lost context): a warning from each would only repeat, once per graph and buffer, that the
  engine itself was not closed. So they warn not at all; ``DeviceContext``, the root every other
  driver handle of an engine lives in, does: an unclosed engine gives one warning, from there, and
  its finalizer's release of the primary context takes every allocation, module and graph of the
  context with it when no other library (CuPy, PyTorch) retains it. Of the parts, ``CompiledGraph``
  keeps a quiet finalizer (``_arm(..., warn=False)``) that destroys its graphs, and ``GpuBuffer``
  one that gives its block back to its pool (no driver call: a block back in its pool is no leak);
  ``BufferPool``, ``ModuleCache`` and ``LibraryHandles`` have none: an unclosed engine's go with
  its context when its ``DeviceContext``'s release is the context's last (where CuPy or PyTorch
  retain the primary context too, they stay until the process ends: close the engine).
- **GL names are deleted only by ``close()``, on the thread that made them**, with their GL
  context current. The garbage collector runs finalizers on whatever thread drops the last
  reference, where that context is not current, or is current for another purpose (deleting a
  name there deletes some other object of the same number), so a finalizer never makes a GL call:
  an unclosed GL owner only warns, and its names live until its GL context is destroyed. Owners
  that close through ``HandleOwner.close`` record the thread that made their GL names, and
  ``close()`` from another thread raises ``InteropError`` (the owner stays open). A ``GlfwWindow``
  is one such owner: GLFW destroys a window only on the thread that made it, so an unclosed window
  only warns and lives, with its GL context, until the process ends. An ``EglContext`` is not: EGL
  is thread-safe (EGL defers ``eglDestroyContext`` while the context is current on some thread), so its
  finalizer destroys the context and gives back the display, with a warning and no GL call; the
  names of its framebuffer go with the context.
- **Driver handles whose CUDA context still lives are released by the finalizer**, with that
  context pushed current for the call (the finalizer's thread may have none), and a
  ``ResourceWarning``. Whether the context still lives is a ``ContextRef``: the context handle,
  its ``cuCtxGetId`` and a reset generation that ``DeviceContext.reset`` bumps (the primary
  context keeps its handle across a reset, so the handle alone cannot tell). A dead context's
  handles are forgotten, as ``abandon()`` does: they died with it. Release errors in a finalizer
  are swallowed (at interpreter exit the driver may already be shutting down).
- A finalizer can run at any moment on any thread, also while another thread captures a stream;
  a driver call then could invalidate that capture. Closing owners explicitly is the contract;
  the finalizer only keeps a forgotten owner from leaking device memory for the rest of the process.
- Owners that only hold other owners (``ImportedImage`` holds an ``ImportedRing`` holding three
  ``ImportedBuffer``) let each part keep its own finalizer: a leaked composite warns once per part.

The owners (what each holds; what its finalizer does with them):

======================  =============================================  ================================
owner                   holds                                          finalizer
======================  =============================================  ================================
``DeviceContext``       primary context retain, two streams            releases, warns (the engine's)
``BufferPool``          ``cuMemAlloc`` blocks                          none: its engine closes it
``GpuBuffer``           a block leased from a ``BufferPool``           returns it to the pool, quiet
``LibraryHandles``      cuBLAS/cuSOLVER/cuSPARSE handles, a stream     none: its engine closes it
``CompiledGraph``       graph, exec graphs, pinned scalars, an event   destroys the graphs, quiet
``ModuleCache``         loaded modules (``cuModuleLoadData``)          none: its engine closes it
``ReadbackRing``        mapped pinned host ring (``cuMemHostAlloc``)   releases, warns
``UploadRing``          mapped pinned host slots and control words     releases, warns
``DownloadRing``        mapped pinned host slots and control words     releases, warns
``SurfaceWriter``       a module and surface objects                   releases, warns
``SharedBuffer``        a graphics registration (+ GL buffer)          unregisters, warns
``SharedTexture2D``     a graphics registration (+ GL texture), a      unregisters, warns
                        ``SurfaceWriter`` (surface_ldst)
``ImportedBuffer``      ``cuMemCreate`` memory + GL buffer and memory  releases CUDA side, warns
``ImportedRing``        events, mapped control words, 3 buffers, GL    releases CUDA side, warns
                        queries
``ImportedImage``       an ``ImportedRing``, GL texture and program    warns (GL only)
``PointRenderer``       GL program and vertex arrays                   warns (GL only)
``TextureRenderer``     GL program and vertex array                    warns (GL only)
``Overlay``             imgui's GL objects and contexts                warns (GL only)
``EglContext``          an EGL context, its offscreen framebuffer      destroys the context, warns
``GlfwWindow``          a GLFW window and its GL context               warns (GL only)
``FrameWord``           a ``memfd`` page registered for the device     unregisters, quiet
``SharedPages``         ``memfd`` pages registered for the device      unregisters, quiet
``IpcImports``          allocations of the engine process opened here  closes them, quiet
======================  =============================================  ================================

"Releases" is made inside the owner's CUDA context while that lives, and never in a dead one (the
handles are forgotten then). ``GlContext`` is the base of ``EglContext`` and ``GlfwWindow``. Parts
owned by one of the above follow their owner: ``LibraryScope`` (plans, generators, workspaces) is
closed by its ``LibraryHandles``; a graph's buffers, captured calls and readback ring by its
``CompiledGraph`` (the ring keeps a warning finalizer of its own). ``Engine``, ``DeviceResources``,
``Preview`` and ``GlBridge`` own no handle themselves: they close the owners they made.

``IsolatedEngine`` (``cudapatch.isolated``) owns no driver handle either, but it owns its engine
process: it follows the protocol (``HandleOwner``), and the finalizer of an unclosed one lets the host's
stream past the child's frames, ends the process (its memory goes with it) and warns. Its host side's
``FrameWord`` and ``IpcImports``, and the ``SharedPages`` of a transfer ring, are parts (quiet, above):
the host side's ``DeviceContext`` warns for them."""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from .errors import CudapatchError, InteropError

__all__ = [
    "ContextRef",
    "HandleOwner",
    "Lifecycle",
    "Releases",
    "note_context_reset",
]


@runtime_checkable
class Lifecycle(Protocol):
    """What every owner of driver or GL handles offers (see the module docstring for the policy)."""

    @property
    def is_closed(self) -> bool:
        """True once ``close()`` or ``abandon()`` ran."""
        ...

    def close(self) -> None:
        """Give every handle back; idempotent."""
        ...

    def abandon(self) -> None:
        """Forget every handle without a driver or GL call (their context is gone); closes."""
        ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


# -- which CUDA context a handle belongs to, and whether it still lives ----------------------------
_generations: dict[int, int] = {}  # context handle -> resets seen (absent: 0)
_generations_lock = threading.Lock()


def note_context_reset(context: Any) -> None:
    """Record that ``context`` (a ``CUcontext``) was reset: every ``ContextRef`` taken before now
    reads as dead, so finalizers forget its handles instead of releasing them. Called by
    ``DeviceContext.reset``."""
    key = int(context)
    with _generations_lock:
        _generations[key] = _generations.get(key, 0) + 1


@dataclass(frozen=True)
class ContextRef:
    """The CUDA context a set of driver handles was made in, as finalizers need it: to push it
    current for the release calls, and to tell whether it still lives.

    Attributes:
        handle: The ``CUcontext``.
        ident: Its ``cuCtxGetId`` (None where the driver has no context ids).
        generation: Its reset count when the handles were made (see ``note_context_reset``).
        driver: The driver module the handles came from: a finalizer asks that one, also when another
            is installed by the time it runs (tests swap doubles; a context handle means nothing to
            any other driver).
    """

    handle: Any
    ident: int | None
    generation: int
    driver: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def current(cls) -> ContextRef | None:
        """The context current on the calling thread, or None when there is none (or no driver)."""
        from .kernels._driver import driver

        try:
            d = driver()
            err, ctx = d.cuCtxGetCurrent()
        except CudapatchError:
            return None
        if err or ctx is None or not int(ctx):
            return None
        res = d.cuCtxGetId(ctx)
        ident = None if res[0] else int(res[1])
        return cls(ctx, ident, _generations.get(int(ctx), 0), d)

    def _driver(self) -> Any:
        if self.driver is not None:
            return self.driver
        from .kernels._driver import driver

        return driver()

    def alive(self) -> bool:
        """Whether the context is still the one the handles were made in (not reset, not destroyed)."""
        if _generations.get(int(self.handle), 0) != self.generation:
            return False
        if self.ident is None:
            return True
        res = self._driver().cuCtxGetId(self.handle)
        return not res[0] and int(res[1]) == self.ident

    @contextmanager
    def pushed(self) -> Iterator[None]:
        """The context current on this thread for the duration (then the previous one again)."""
        from .kernels._driver import check

        d = self._driver()
        check(d.cuCtxPushCurrent(self.handle), "cuCtxPushCurrent")
        try:
            yield
        finally:
            d.cuCtxPopCurrent()


# -- the driver handles an owner must give back ----------------------------------------------------
class Releases:
    """The driver calls that give an owner's handles back, in the order the handles were made;
    released in reverse. Shared by the owner (``close``) and its finalizer, which must not hold
    the owner itself: an owner pushes each release as soon as its handle exists, so a constructor
    that fails half-way gives back exactly what it made.
    """

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: list[tuple[Callable[..., Any], tuple[Any, ...], str]] = []

    def push(self, call: Callable[..., Any], *args: Any, what: str) -> None:
        """Remember to call ``call(*args)`` (a driver function returning its result tuple)."""
        self._calls.append((call, args, what))

    def __len__(self) -> int:
        return len(self._calls)

    def mapped_host(self, nbytes: int) -> tuple[int, int]:
        """``nbytes`` of zeroed pinned host memory that kernels address directly (``cuMemHostAlloc``,
        DEVICEMAP | PORTABLE): ``(host address, device address)``. Its ``cuMemFreeHost`` is pushed as
        soon as it exists; that free waits for the device, so work still reading or writing the
        memory finishes before it goes.

        Raises:
            CudaError: the allocation failed, or its device address (the free is pushed then).
        """
        import ctypes

        from .kernels._driver import check, driver

        d = driver()
        host = int(check(d.cuMemHostAlloc(nbytes, 0x2 | 0x1), "cuMemHostAlloc"))
        self.push(d.cuMemFreeHost, host, what="cuMemFreeHost")
        ctypes.memset(host, 0, nbytes)
        return host, int(check(d.cuMemHostGetDevicePointer(host, 0), "cuMemHostGetDevicePointer"))

    def release(self) -> None:
        """Make every release call, newest first; each is made even when an earlier one failed.

        Raises:
            CudaError: the first release call that failed.
        """
        from .kernels._driver import check

        first: Exception | None = None
        while self._calls:
            call, args, what = self._calls.pop()
            try:
                check(call(*args), what)
            except Exception as exc:  # go on: the other handles are still worth giving back
                first = first or exc
        if first is not None:
            raise first

    def release_quietly(self) -> None:
        """``release`` ignoring every error (a finalizer's: nobody could handle them there)."""
        while self._calls:
            call, args, _ = self._calls.pop()
            try:
                call(*args)
            except Exception:  # at interpreter exit the driver may be gone; nothing to report to
                pass

    def forget(self) -> None:
        """Drop every release call unmade: the handles died with their context."""
        self._calls.clear()


def _finalize(
    what: str, releases: Releases | None, context: ContextRef | None, gl_names: bool, warn: bool = True
) -> None:
    """The finalizer of an owner nobody closed (module level: it must not hold the owner). ``releases``
    is anything with ``__len__``, ``release_quietly`` and ``forget`` (a ``Releases`` mostly)."""
    outcome = ""
    try:
        if releases:
            if context is not None and not context.alive():
                releases.forget()
                outcome = "its CUDA context is gone, and its driver handles with it"
            else:
                if context is not None:
                    with context.pushed():
                        releases.release_quietly()
                else:
                    releases.release_quietly()
                outcome = "its driver handles were released by its finalizer"
    except Exception:  # pushing the context failed: the handles stay where they are
        outcome = "its driver handles could not be released"
    finally:
        # warn=False: an engine part (see the table above); its engine's DeviceContext warns instead.
        if warn:
            leak = "its GL names leak until its GL context is destroyed" if gl_names else ""
            parts = [p for p in (outcome, leak) if p]
            detail = f" ({'; '.join(parts)})" if parts else ""
            warnings.warn(
                f"unclosed {what}{detail}: call close() (on its GL thread for GL objects) or use it in a with block",
                ResourceWarning,
                stacklevel=2,
            )


class HandleOwner:
    """The ``Lifecycle`` protocol, implemented once: context manager, ``is_closed``, idempotent
    ``close()`` around the subclass's ``_release()``, ``abandon()`` around ``_forget()``, the
    closed check, and the finalizer (``_arm``).

    A subclass keeps its driver handles in a ``Releases`` (``self._releases``) and passes it to
    ``_arm``; one that makes GL names calls ``_arm(..., gl_names=True)``, deletes them in
    ``_release()`` and gets ``close()`` refused off the thread that made them. Classes that predate
    the protocol keep their own ``close``/``is_closed``/``abandon`` and inherit the rest.
    """

    #: The error a use after close raises (``InteropError`` for GL interop objects).
    _closed_error: ClassVar[type[CudapatchError]] = CudapatchError
    _closed: bool = False
    _finalizer: weakref.finalize | None = None
    _gl_thread: int | None = None  # the thread that made this owner's GL names (None: it has none)

    @property
    def is_closed(self) -> bool:
        """True once ``close()`` or ``abandon()`` ran."""
        return self._closed

    def close(self) -> None:
        """Give every handle back; idempotent. GL owners: on the thread that made them, with their GL
        context (and the CUDA context of their driver handles) current.

        Raises:
            InteropError: a GL owner closed from another thread (it stays open).
            CudaError: a release call failed (the owner is closed all the same).
        """
        if self._closed:
            return
        self._check_gl_thread("close")
        self._closed = True
        self._disarm()
        self._release()

    def abandon(self) -> None:
        """Forget every handle without a driver or GL call: their context is gone (after a reset, see
        ``engine/recovery.py``). The owner is closed afterwards."""
        self._closed = True
        self._disarm()
        self._forget()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- for subclasses ----------------------------------------------------------------------------
    def _release(self) -> None:
        """Give the handles back (called once, by ``close``)."""
        releases = getattr(self, "_releases", None)
        if releases is not None:
            releases.release()

    def _forget(self) -> None:
        """Drop the handles unreleased (called by ``abandon``)."""
        releases = getattr(self, "_releases", None)
        if releases is not None:
            releases.forget()

    def _arm(
        self,
        what: str,
        *,
        releases: Releases | None = None,
        context: ContextRef | None = None,
        gl_names: bool = False,
        warn: bool = True,
    ) -> None:
        """Register the finalizer (see the module docstring): it releases ``releases`` in ``context``
        if that still lives (forgets them if not), and warns that ``what`` was never closed.
        ``gl_names``: this owner also made GL names on the calling thread (deleted only by ``close``
        there). ``warn=False``: a quiet finalizer, for the parts an engine always closes itself."""
        if gl_names:
            self._gl_thread = threading.get_ident()
        self._finalizer = weakref.finalize(self, _finalize, what, releases, context, gl_names, warn)

    def _disarm(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()

    def _check_open(self, what: str) -> None:
        """Raise ``_closed_error`` naming ``what`` when the owner is closed."""
        if self._closed:
            raise self._closed_error(f"{what}: {type(self).__name__} is closed")

    def _check_gl_thread(self, what: str) -> None:
        if self._gl_thread is not None and threading.get_ident() != self._gl_thread:
            raise InteropError(
                f"{what}: {type(self).__name__} holds GL names made on another thread; close it on that thread "
                "with its GL context current"
            )
