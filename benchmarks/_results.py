"""Where the benchmarks leave their numbers: a JSON file in ``$RESULTS_DIR`` when it is set."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_results(filename: str, data: Any, indent: int | None = 1, **dumps: Any) -> None:
    """Write ``data`` as JSON to ``$RESULTS_DIR/filename``; nothing when ``RESULTS_DIR`` is unset.

    ``dumps``: further ``json.dumps`` arguments (``default=str`` for values JSON cannot hold).
    """
    out = os.environ.get("RESULTS_DIR")
    if out:
        Path(out, filename).write_text(json.dumps(data, indent=indent, **dumps))
