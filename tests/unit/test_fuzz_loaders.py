"""Fuzzing the file loaders: 1,000 seeded mutations of valid files per loader (sidecar JSON, PTX,
patch TOML, ``.cu``, cubin cache entries). Only ``CudapatchError`` may escape, and no case may take
longer than the bound. ``tools/fuzz_loaders.py`` runs many more with other seeds.

A failure prints the cases that failed; replay one with
``python tools/fuzz_loaders.py --loader L --seed S --start I --cases 1 --save DIR``.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import pytest

from .loader_fuzz import LOADERS, SEEDS, Case, fuzz, mutate, run_case

SEED = int(os.environ.get("CUDAPATCH_FUZZ_SEED", "22"))
CASES = int(os.environ.get("CUDAPATCH_FUZZ_CASES", "1000"))
BOUND_S = 2.0  # per case; cases take milliseconds, the margin is for a loaded 2-core machine (a hang or a
# quadratic parse of the size limits takes far longer)


@pytest.fixture(autouse=True)
def _quiet() -> None:
    # The cache logs every corrupt entry it meets; thousands of warnings say nothing here.
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_seeds_load(loader: str, tmp_path: Path) -> None:
    """Every seed loads as it is: the fuzzer starts from valid files, so mutations reach deep checks."""
    for i, data in enumerate(SEEDS[loader]):
        failure, _, refused = run_case(Case(loader, i, data), tmp_path, SEED, bound=5.0)
        assert failure is None and not refused, (loader, i, failure)


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_mutated_files_only_raise_cudapatch_errors_quickly(loader: str, tmp_path: Path) -> None:
    report = fuzz(loader, CASES, SEED, tmp_path, bound=BOUND_S)
    assert report.cases == CASES
    assert not report.failures, f"{len(report.failures)} of {CASES} cases failed (seed {SEED}):\n" + "\n".join(
        str(f) for f in report.failures[:10]
    )
    if loader != "cache":  # some mutations keep a file valid: the loaders accept those, not refuse all
        assert report.refused < report.cases


def test_mutations_are_deterministic_and_varied() -> None:
    data = SEEDS["patch"][0]
    first = [mutate(random.Random(f"1:patch:{i}"), data, "patch") for i in range(50)]
    again = [mutate(random.Random(f"1:patch:{i}"), data, "patch") for i in range(50)]
    assert first == again  # case i of a seed is the same input on every run
    assert len(set(first)) > 40 and sum(m != data for m in first) > 45
