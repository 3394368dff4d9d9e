#!/usr/bin/env python3
"""Regenerate the bundled kernels' ``.ptx`` and ``.json`` sidecars from their ``.cu`` sources.

Usage: ``python tools/build_kernels.py [--nvrtc] [DIR ...]`` (default: ``cudapatch/kernels/ptx``).
Compiles with ``nvcc``, or with ``--nvrtc`` through the NVRTC that cuda-bindings installed (no CUDA
toolkit needed; the engine's own ``_toolchain.nvrtc_ptx``, which finds the wheels as the engine
does). The PTX ISA is the compiler's: PTX from CUDA 13 (ISA 9.0) does not link with CUDA 12's
nvJitLink, so an installation with the CUDA 12 wheels rebuilds the kernels with ``--nvrtc``.

The sidecar is derived from the ``extern "C" __global__`` signature: ``const T*`` is an input,
``T*`` an output, ``/*inout*/ T*`` both, by-value parameters are inputs. ``// cudapatch: key=value``
lines set ``blockSize``, ``sharedMemoryBytes`` and ``description``. The PTX targets compute_75 (the
oldest architecture CUDA 13 supports) so the driver can JIT it for any newer GPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cudapatch.kernels._toolchain import nvrtc_ptx  # noqa: E402
from cudapatch.kernels.descriptor import descriptor_to_json  # noqa: E402
from cudapatch.kernels.signature import describe_cuda_source  # noqa: E402


def describe(cu: Path):
    return describe_cuda_source(cu.read_text(), file=str(cu))


def build(cu: Path, *, use_nvrtc: bool = False) -> None:
    ptx = cu.with_suffix(".ptx")
    if use_nvrtc:
        ptx.write_bytes(nvrtc_ptx(cu.read_text(), name=cu.name))
    else:
        subprocess.run(["nvcc", "-ptx", "-arch=compute_75", "-O3", "-o", str(ptx), str(cu)], check=True)
    cu.with_suffix(".json").write_text(descriptor_to_json(describe(cu)))
    print(f"built {ptx.relative_to(ROOT) if ptx.is_relative_to(ROOT) else ptx}")


def main(argv: list[str]) -> None:
    use_nvrtc = "--nvrtc" in argv
    dirs = [Path(a) for a in argv if a != "--nvrtc"] or [ROOT / "cudapatch" / "kernels" / "ptx"]
    for d in dirs:
        for cu in sorted(d.glob("*.cu")):
            build(cu, use_nvrtc=use_nvrtc)


if __name__ == "__main__":
    main(sys.argv[1:])
