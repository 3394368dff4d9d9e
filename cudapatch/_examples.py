"""What the numbered examples share: a ``main`` that ends in one line instead of a traceback.

A new user's first run of an example is often on a machine without an NVIDIA driver or GPU (a
laptop, a CI runner). There the engine's constructor raises ``CudaUnavailableError``, and a bare
``main()`` would print a dozen lines of traceback through the engine's internals that end in the
bindings' own text. ``example_main`` prints the line ``cudapatch run`` prints instead (what is
missing, the driver cudapatch needs, ``cudapatch check``) and returns a non-zero exit status.

The same goes for cudapatch's other errors, whose text already names the block, port, file and
line (no display for a window, a bad patch file): one line, as ``cudapatch run`` prints them. A
driver call that failed (``CudaError``) and any other exception keep their traceback, as a bug on a
machine with CUDA should; but an exception raised inside a GPU library (cuda-bindings, CuPy, Numba,
nvmath) while this machine has no usable CUDA is explained as missing CUDA, since that is what the
user has to fix.

The examples import this module (not a file beside them), so an example copied elsewhere, or
pasted into a file without its main guard, still runs.
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec

from .errors import CudaError, CudapatchError, CudaUnavailableError
from .preflight import cuda_unavailable_line, explain_unavailable

__all__ = ["EXIT_ERROR", "EXIT_NO_CUDA", "example_main"]

EXIT_NO_CUDA = 2
"""The exit status of a script stopped because CUDA is unavailable (``cudapatch run`` uses the same)."""
EXIT_ERROR = 1
"""The exit status of a script stopped by another cudapatch error (printed as one line)."""

_P = ParamSpec("_P")
# Top-level packages whose errors mean "CUDA is missing" when the driver probe finds none.
_GPU_LIBRARIES = frozenset({"cuda", "cupy", "cupy_backends", "numba", "numba_cuda", "nvmath"})


def _raised_in_gpu_library(exc: BaseException) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is in one of ``_GPU_LIBRARIES``."""
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    module = frames[-1].f_globals.get("__name__", "") if frames else ""
    return module.split(".")[0] in _GPU_LIBRARIES


def _program() -> str:
    argv0 = sys.argv[0] if sys.argv else ""
    return Path(argv0).name if argv0 and argv0 != "-c" else "cudapatch"


def example_main(main: Callable[_P, int]) -> Callable[_P, int]:
    """Decorate a script's ``main``: an error a user can fix prints one line on stderr, not a traceback.

    No usable CUDA (``CudaUnavailableError``, or an error from inside a GPU library while the driver
    probe finds none) prints what is missing and returns ``EXIT_NO_CUDA``; another ``CudapatchError`` (not a failed
    driver call) prints its message and returns ``EXIT_ERROR``.

    Args:
        main: The script's entry point, returning its exit status.

    Returns:
        ``main`` with those errors turned into ``<script>: <message>`` on stderr.
    """

    @functools.wraps(main)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except CudaUnavailableError as exc:
            line, status = explain_unavailable(exc), EXIT_NO_CUDA
        except CudaError:
            raise  # a driver call failed on a machine with CUDA: the traceback is worth reporting
        except CudapatchError as exc:
            line, status = str(exc), EXIT_ERROR
        except Exception as exc:
            # CuPy's or Numba's own error on a machine without a driver; anything else is a bug
            missing = cuda_unavailable_line() if _raised_in_gpu_library(exc) else None
            if missing is None:
                raise
            line, status = missing, EXIT_NO_CUDA
        print(f"{_program()}: {line}", file=sys.stderr)
        return status

    return run
