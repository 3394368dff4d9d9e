"""What the numbered examples share: a ``main`` that ends in one line when the machine has no CUDA.

A new user's first run of an example is often on a machine without an NVIDIA driver or GPU (a
laptop, a CI runner). There the engine's constructor raises ``CudaUnavailableError``, and a bare
``main()`` would print a dozen lines of traceback through the engine's internals that end in the
bindings' own text. ``example_main`` prints the line ``cudapatch run`` prints instead (what is
missing, the driver cudapatch needs, ``cudapatch check``) and returns a non-zero exit status.
Every other error keeps its traceback: on a machine with CUDA it is a bug worth reporting.

The examples import this module (not a file beside them), so an example copied elsewhere, or
pasted into a file without its main guard, still runs.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec

from .errors import CudaUnavailableError
from .preflight import explain_unavailable

__all__ = ["EXIT_NO_CUDA", "example_main"]

EXIT_NO_CUDA = 2
"""The exit status of a script stopped because CUDA is unavailable (``cudapatch run`` uses the same)."""

_P = ParamSpec("_P")


def _program() -> str:
    argv0 = sys.argv[0] if sys.argv else ""
    return Path(argv0).name if argv0 and argv0 != "-c" else "cudapatch"


def example_main(main: Callable[_P, int]) -> Callable[_P, int]:
    """Decorate a script's ``main``: no CUDA prints one line on stderr and returns ``EXIT_NO_CUDA``.

    Args:
        main: The script's entry point, returning its exit status.

    Returns:
        ``main`` with ``CudaUnavailableError`` turned into ``<script>: <what is missing>`` on stderr.
    """

    @functools.wraps(main)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except CudaUnavailableError as exc:
            print(f"{_program()}: {explain_unavailable(exc)}", file=sys.stderr)
            return EXIT_NO_CUDA

    return run
