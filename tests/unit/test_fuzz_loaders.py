"""Fuzzing the file loaders: 1,000 seeded mutations of valid files per loader (sidecar JSON, PTX,
patch TOML, ``.cu``, cubin cache entries), some with a FIFO, a device link or a directory in place of
one of their files (an include target too). Only ``CudapatchError`` may escape, it must name one of
the case's files, and no case may take longer than the bound. ``tools/fuzz_loaders.py`` runs many
more with other seeds.

A failure prints the cases that failed; replay one with
``python tools/fuzz_loaders.py --loader L --seed S --start I --cases 1 --save DIR``.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import pytest

from .loader_fuzz import (
    _SIDECAR_OF,
    LOADERS,
    SEEDS,
    SPECIAL_KINDS,
    SPECIAL_TARGETS,
    Case,
    fuzz,
    make_case,
    mutate,
    run_case,
)

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


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_non_regular_files_are_refused_naming_the_file(loader: str, tmp_path: Path) -> None:
    """Each kind of non-regular file in place of each file a loader reads (a ``.cu``'s include too), on
    a valid seed: refused with a cudapatch error naming a file of the case, within the bound (a read
    that blocked on a FIFO would never return). The cache takes it as a miss."""
    data = SEEDS[loader][0]
    sidecar = _SIDECAR_OF[data] if loader == "ptx" else b""
    for kind in SPECIAL_KINDS:
        for target in SPECIAL_TARGETS[loader]:
            case = Case(loader, 0, data, sidecar, (kind, target))
            failure, _, refused = run_case(case, tmp_path, SEED, bound=BOUND_S)
            assert failure is None, failure
            # NVRTC searches on past a directory named by an include, so that case is no error (nor a hang).
            passed_over = loader == "cu" and target == "k.cuh" and kind == "directory"
            assert refused == (loader != "cache" and not passed_over), (kind, target)


def test_the_fuzz_cases_include_non_regular_files() -> None:
    for loader in LOADERS:
        specials = {make_case(loader, i, SEED).special for i in range(CASES)} - {None}
        assert specials, loader
        assert {target for _, target in specials} <= set(SPECIAL_TARGETS[loader])
