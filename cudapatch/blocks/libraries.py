"""LibraryScope: what a captured call function may ask of the engine, typed for plugin authors.

A captured call (``cudapatch.blocks.captured``) runs as ``fn(stream, pointers, scalars, libs)``
inside a stream capture, and its ``prepare`` step as ``prepare(pointers, scalars, libs)`` just
before, outside it. ``libs`` is the engine's library state *for that one call*: the engine-wide
cuBLAS, cuSOLVER and cuSPARSE handles, and the call's own workspaces, cuFFT plans and cuRAND
generators. This module says what ``libs`` offers, as a Protocol, so a block depends on this
contract and not on the engine that implements it (``cudapatch.engine.libraries``).

Capture is why the contract has two halves. Anything that allocates or initialises (a workspace,
a plan, a generator's seed kernels) would become an allocation node in the graph or fail the
capture, so it happens in ``prepare``; the call itself then asks again for the same resource and
gets the cached one::

    def prepare(pointers, scalars, libs: LibraryScope) -> None:
        libs.fft_plan("R2C", (scalars["N"],), 1)          # creates and caches the plan

    def call(stream, pointers, scalars, libs: LibraryScope) -> None:
        plan = libs.fft_plan("R2C", (scalars["N"],), 1, stream)  # the cached plan, on ``stream``
        nvmath_module("cufft").exec_r2c(plan, pointers["In"], pointers["Out"])

The raw bindings are nvmath-python's (``nvmath.bindings.cublas`` ...); ``nvmath_module`` imports
them on first use, so a patch without library blocks never loads them.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from ..errors import LibraryCallError
from ..kernels._wheel_libs import NVMATH_LIBS, load_wheel_libs

__all__ = ["LibraryScope", "nvmath_module"]


def nvmath_module(name: str) -> Any:
    """``nvmath.bindings.<name>`` (``cublas``, ``cufft``, ``curand``, ``cusolverDn``, ``cusparse``),
    imported on first use, for call functions.

    Raises:
        LibraryCallError: nvmath-python or the library itself is not installed (says how to fix it).
    """
    load_wheel_libs(NVMATH_LIBS.get(name, ()))  # where pip --target put the wheels, pathfinder does not look
    try:
        return importlib.import_module(f"nvmath.bindings.{name}")
    except ImportError as exc:
        raise LibraryCallError(
            f"library calls need nvmath-python ({exc}): pip install nvmath-python (a dependency of cudapatch)"
        ) from None


class LibraryScope(Protocol):
    """The library resources of one captured call, as its call function and ``prepare`` see them.

    Handles are the engine's (one per engine, shared by its calls: capture records the work, not
    the handle); workspaces, plans and generators belong to this call alone, because two calls
    of one graph may run concurrently and must never share scratch memory. Everything a call
    reserves lives until the call leaves the graph. Integers are the libraries' raw handles, as
    nvmath-python's bindings take them.
    """

    @property
    def capture_stream_handle(self) -> int:
        """The stream captures run on, as an integer: for ``prepare`` steps that must bind a handle
        to a stream to query it (cuSOLVER's and cuSPARSE's buffer-size functions)."""
        ...

    @property
    def capturing(self) -> bool:
        """True while the call is being captured, when nothing may allocate or initialise."""
        ...

    def workspace(self, name: str, nbytes: int) -> int:
        """Device address of this call's workspace ``name``, at least ``nbytes`` long (256-byte
        aligned). Reserve it in ``prepare``; in the call, ask with ``nbytes=0`` for the reserved one.

        Raises:
            CudaError: the allocation failed.
        """
        ...

    def cublas(self, stream: int) -> int:
        """The engine's cuBLAS handle bound to ``stream``, in device pointer mode (``alpha`` and
        ``beta`` are device addresses), with this call's workspace set, so the capture holds no
        allocation.

        Raises:
            LibraryCallError: nvmath-python or cuBLAS is not installed.
        """
        ...

    def cusolver(self, stream: int) -> int:
        """The engine's cuSOLVER dense handle bound to ``stream``.

        Raises:
            LibraryCallError: nvmath-python or cuSOLVER is not installed.
        """
        ...

    def cusparse(self, stream: int) -> int:
        """The engine's cuSPARSE handle bound to ``stream``, in device pointer mode.

        Raises:
            LibraryCallError: nvmath-python or cuSPARSE is not installed.
        """
        ...

    def fft_plan(self, kind: str, shape: tuple[int, ...], batch: int, stream: int | None = None) -> int:
        """This call's cuFFT plan of ``kind`` (``C2C``, ``R2C``, ``C2R``, ``Z2Z``, ``D2Z``, ``Z2D``)
        for ``shape`` (1-D or 2-D, row-major, packed) and ``batch``; bound to ``stream`` when given.
        Create it in ``prepare``: inside capture only a plan made before may be asked for.

        Raises:
            LibraryCallError: a new plan was asked for during capture, or cuFFT refused the plan.
        """
        ...

    def generator(self, kind: str = "PSEUDO_DEFAULT", seed: int = 0, stream: int | None = None) -> int:
        """This call's cuRAND generator of ``kind`` (a ``curandRngType`` name without ``CURAND_RNG_``)
        seeded with ``seed``; bound to ``stream`` when given. Create it in ``prepare``: its seed
        kernels cannot run inside a capture. A captured generate call yields new numbers on every
        launch of the graph.

        Raises:
            LibraryCallError: a new generator was asked for during capture.
        """
        ...
