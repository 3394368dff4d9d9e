"""The expression JIT probe without a GPU: its arguments, and every PTX variant it loads assembles
with ``ptxas`` and keeps the generated kernel's signature (so one launch fits them all)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudapatch.expr.ptx_gen import f32_hex
from cudapatch.kernels.ptx import parse_ptx

PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "probes" / "probe_expression_jit.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("probe_expression_jit", PROBE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arguments(probe) -> None:
    args = probe.parse_args(["--dry-run", "--reps", "3", "--elements", "4096"])
    assert args.dry_run and args.reps == 3 and args.elements == 4096 and args.launches == 200
    with pytest.raises(SystemExit):
        probe.parse_args(["--reps", "0"])


def test_variants_keep_the_signature_and_replace_every_scalar_load(probe) -> None:
    built = probe.build_all("sm_90")
    assert set(built) == {
        "chain1",
        "chain10",
        "chain100",
        "chain100_imm",
        "chain100_const",
        "chain100_global",
        *(f"chain100_x{k}" for k in probe.PER_THREAD),
    }
    base = parse_ptx(built["chain100"]).entries["expression"].params
    for name in ("chain100_imm", "chain100_const", "chain100_global"):
        text = built[name]
        assert parse_ptx(text).entries["expression"].params == base, name
        assert "ld.param.f32" not in text, name  # every scalar comes from elsewhere
    values = probe.chain_scalars(100)
    imm = built["chain100_imm"]
    assert f32_hex(values[0]) in imm and f32_hex(values[199]) in imm
    assert len(re.findall(r"ld\.const\.f32", built["chain100_const"])) == 200
    assert ".global .align 4 .f32 cp_scalars[200];" in built["chain100_global"]
    salted = probe.salted(built["chain1"], 42)
    assert "cp_salt = 42;" in salted and salted != probe.salted(built["chain1"], 43)


def test_every_variant_assembles_with_ptxas(probe, tmp_path: Path) -> None:
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas (CUDA toolkit) is not installed")
    for name, text in probe.build_all("sm_90").items():
        path = tmp_path / f"{name}.ptx"
        path.write_text(probe.salted(text, 7))
        done = subprocess.run(
            [ptxas, "-v", "-arch=sm_90", str(path), "-o", str(tmp_path / "k.cubin")], capture_output=True
        )
        assert done.returncode == 0, (name, done.stderr.decode())
        assert b"spill" in done.stderr and b" 0 bytes spill stores" in done.stderr, name


def test_dry_run_writes_the_variants(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(PROBE), "--dry-run", "--ptx-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "every PTX variant built" in done.stdout
    names = ("chain1", "chain10", "chain100", "chain100_imm", "chain100_const", "chain100_global")
    names += ("chain100_x2", "chain100_x4", "chain100_x8")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.ptx" for n in names)
