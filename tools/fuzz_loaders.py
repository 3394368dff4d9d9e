#!/usr/bin/env python3
"""Fuzz cudapatch's file loaders at length (the nightly counterpart of tests/unit/test_fuzz_loaders.py).

Usage::

    python tools/fuzz_loaders.py --cases 100000 --seed 7            # every loader
    python tools/fuzz_loaders.py --loader patch --cases 5000 --seed 3 --bound 0.2
    python tools/fuzz_loaders.py --loader cu --seed 22 --start 876 --cases 1 --save /tmp/case  # replay one

Prints one line per loader (cases, how many were refused with a cudapatch error, the slowest case)
and every failing case: a non-cudapatch exception, a cudapatch error that names none of the case's
files, or a case slower than ``--bound`` seconds. Some cases put a FIFO, a symlink to one or to
``/dev/zero``, or a directory where a file (or a ``.cu``'s ``#include``) is expected; the failure line
says which. A read blocked on a FIFO never returns, so run this under ``timeout``: a hang is a failure. With
``--save DIR`` the failing inputs are written there (``<loader>-<seed>-<case>.bin``). Exits 1 if any
case failed. The cases are those of the CI test (tests/unit/loader_fuzz.py), so a seed and case number
reproduce a failure anywhere.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.unit.loader_fuzz import LOADERS, corpus_summary, fuzz  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases per loader (default 10000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the cases (default 1)")
    parser.add_argument("--start", type=int, default=0, help="first case number (default 0)")
    parser.add_argument("--loader", choices=sorted(LOADERS), action="append", help="only this loader (repeatable)")
    parser.add_argument("--bound", type=float, default=0.5, help="seconds a case may take (default 0.5)")
    parser.add_argument("--save", type=Path, default=None, help="write failing inputs into this directory")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the loaders' log messages")
    args = parser.parse_args(argv)
    if not args.verbose:
        logging.disable(logging.WARNING)  # the cache logs each corrupt entry it meets
    print(f"seed {args.seed}, cases {args.start}..{args.start + args.cases - 1}; {corpus_summary()}")
    failed = 0
    for name in args.loader or sorted(LOADERS):
        with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as tmp:
            report = fuzz(name, args.cases, args.seed, Path(tmp), bound=args.bound, start=args.start)
        print(
            f"{name:8} {report.cases} cases in {report.seconds:.1f} s: {report.refused} refused, "
            f"slowest {report.worst * 1000:.1f} ms, {len(report.failures)} failed"
        )
        for failure in report.failures:
            print(f"  {failure}")
            if args.save is not None:
                args.save.mkdir(parents=True, exist_ok=True)
                case = failure.case
                (args.save / f"{name}-{args.seed}-{case.index}.bin").write_bytes(case.data)
                if case.sidecar:
                    (args.save / f"{name}-{args.seed}-{case.index}.json").write_bytes(case.sidecar)
        failed += len(report.failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
