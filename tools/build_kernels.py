#!/usr/bin/env python3
"""Regenerate the bundled kernels' ``.ptx`` and ``.json`` sidecars from their ``.cu`` sources.

Usage: ``python tools/build_kernels.py [DIR ...]`` (default: ``cudapatch/kernels/ptx``). Needs ``nvcc``.

The sidecar is derived from the ``extern "C" __global__`` signature: ``const T*`` is an input,
``T*`` an output, ``/*inout*/ T*`` both, by-value parameters are inputs. ``// cudapatch: key=value``
lines set ``blockSize``, ``sharedMemoryBytes`` and ``description``. The PTX targets compute_75 (the
oldest architecture CUDA 13 supports) so the driver can JIT it for any newer GPU.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cudapatch.kernels.descriptor import KernelDescriptor, KernelParamDescriptor, descriptor_to_json  # noqa: E402
from cudapatch.kernels.types import parse_type_name  # noqa: E402

_SIG = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.DOTALL)
_META = re.compile(r"^//\s*cudapatch:\s*(\w+)\s*=\s*(.*)$", re.MULTILINE)


def describe(cu: Path) -> KernelDescriptor:
    text = cu.read_text()
    m = _SIG.search(text)
    if m is None:
        raise SystemExit(f'{cu}: no extern "C" __global__ kernel found')
    meta = {k: v.strip() for k, v in _META.findall(text)}
    params = []
    for raw in m.group(2).split(","):
        decl = " ".join(raw.replace("__restrict__", "").split())
        inout = "/*inout*/" in decl
        decl = decl.replace("/*inout*/", "").strip()
        pm = re.fullmatch(r"(const\s+)?([\w ]+?)\s*(\*?)\s*(\w+)", decl)
        if pm is None:
            raise SystemExit(f"{cu}: cannot read parameter '{raw.strip()}'")
        const, ctype, star, name = pm.groups()
        dtype, _ = parse_type_name(ctype)
        is_ptr = bool(star)
        direction = "in" if (not is_ptr or const) else ("inout" if inout else "out")
        params.append(KernelParamDescriptor(name=name, dtype=dtype, is_pointer=is_ptr, direction=direction))
    return KernelDescriptor(
        entry_point=m.group(1),
        parameters=tuple(params),
        block_size=int(meta.get("blockSize", 256)),
        shared_memory_bytes=int(meta.get("sharedMemoryBytes", 0)),
        description=meta.get("description", ""),
    )


def build(cu: Path) -> None:
    ptx = cu.with_suffix(".ptx")
    subprocess.run(["nvcc", "-ptx", "-arch=compute_75", "-O3", "-o", str(ptx), str(cu)], check=True)
    cu.with_suffix(".json").write_text(descriptor_to_json(describe(cu)))
    print(f"built {ptx.relative_to(ROOT) if ptx.is_relative_to(ROOT) else ptx}")


def main(argv: list[str]) -> None:
    dirs = [Path(a) for a in argv] or [ROOT / "cudapatch" / "kernels" / "ptx"]
    for d in dirs:
        for cu in sorted(d.glob("*.cu")):
            build(cu)


if __name__ == "__main__":
    main(sys.argv[1:])
