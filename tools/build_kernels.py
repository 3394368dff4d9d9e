#!/usr/bin/env python3
"""Regenerate the bundled kernels' ``.ptx`` and ``.json`` sidecars from their ``.cu`` sources.

Usage: ``python tools/build_kernels.py [--nvrtc] [DIR ...]`` (default: ``cudapatch/kernels/ptx``).
Compiles with ``nvcc``, or with ``--nvrtc`` through the NVRTC that cuda-bindings installed (no CUDA
toolkit needed). The PTX ISA is the compiler's: PTX from CUDA 13 (ISA 9.0) does not link with CUDA
12's nvJitLink, so an installation with the CUDA 12 wheels rebuilds the kernels with ``--nvrtc``.

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

from cudapatch.kernels.descriptor import descriptor_to_json  # noqa: E402
from cudapatch.kernels.signature import describe_cuda_source  # noqa: E402


def describe(cu: Path):
    return describe_cuda_source(cu.read_text(), file=str(cu))


def nvrtc_ptx(cu: Path) -> bytes:
    """PTX for compute_75 from NVRTC (optimized, as ``nvcc -O3``: NVRTC optimizes by default)."""
    from cuda.bindings import nvrtc

    def check(result: tuple):
        if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"{cu}: NVRTC failed: {nvrtc.nvrtcGetErrorString(result[0])[1].decode()}")
        return result[1] if len(result) > 1 else None

    prog = check(nvrtc.nvrtcCreateProgram(cu.read_bytes(), cu.name.encode(), 0, [], []))
    try:
        opts = [b"-arch=compute_75", b"-std=c++17"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            log = bytes(check(nvrtc.nvrtcGetProgramLogSize(prog)))
            check(nvrtc.nvrtcGetProgramLog(prog, log))
            text = log.rstrip(b"\0").decode(errors="replace")
            raise RuntimeError(f"{cu}: does not compile:\n{text}")
        ptx = bytes(check(nvrtc.nvrtcGetPTXSize(prog)))
        check(nvrtc.nvrtcGetPTX(prog, ptx))
        return ptx.rstrip(b"\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def build(cu: Path, *, use_nvrtc: bool = False) -> None:
    ptx = cu.with_suffix(".ptx")
    if use_nvrtc:
        ptx.write_bytes(nvrtc_ptx(cu))
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
