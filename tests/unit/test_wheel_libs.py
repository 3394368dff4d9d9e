"""Kernels compile where ``pip install --target`` put cudapatch and the NVIDIA wheels (TouchDesigner's
module path): a folder on ``sys.path`` that cuda-pathfinder does not search.

The folder is made here from this environment's packages (links, no index needed) and used by a bare
interpreter (a venv without packages), so pathfinder's site-packages search finds nothing and only
``sys.path`` holds the libraries, as in TouchDesigner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from cudapatch.kernels._wheel_libs import wheel_lib_paths

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json
from cuda.pathfinder import load_nvidia_dynamic_lib
from cudapatch.kernels._wheel_libs import NVMATH_LIBS, load_wheel_libs, wheel_lib_paths

def finds(name):
    try:
        load_nvidia_dynamic_lib(name)
        return True
    except Exception:
        return False

present = [n for n in ("nvrtc", "nvJitLink", "cublasLt", "cublas", "cufft", "curand", "cusparse", "cusolver")
           if wheel_lib_paths(n)]
missed = [n for n in present if not finds(n)]  # before: what pathfinder alone finds
import cudapatch
from cudapatch import CudaSource
from cudapatch.kernels._toolchain import link_ptx
cubin = CudaSource(code='extern "C" __global__ void k(float* o) { o[0] = 1.0f; }', name="k.cu").compile("sm_90")
ptx = b".version 8.0\\n.target sm_75\\n.address_size 64\\n.visible .entry k() { ret; }\\n"  # any CUDA 12 or 13
linked = link_ptx(ptx, name="k.ptx", arch="sm_90")
for libs in NVMATH_LIBS.values():  # what nvmath_module does before nvmath loads a library
    load_wheel_libs(libs)
print(json.dumps({"present": present, "missed": missed, "found": [n for n in present if finds(n)],
                  "where": cudapatch.__file__, "kinds": [cubin.kind, linked[:4] == b"\\x7fELF"]}))
"""


def test_wheel_lib_paths_finds_the_installed_compilers():
    for name in ("nvrtc", "nvJitLink"):
        assert wheel_lib_paths(name, ["/nonexistent"]) == []
    if not wheel_lib_paths("nvrtc"):
        pytest.skip("NVRTC is not installed from a wheel here (a toolkit install)")
    assert all(p.is_file() for p in wheel_lib_paths("nvrtc") + wheel_lib_paths("nvJitLink"))


def test_kernels_compile_from_a_target_folder(tmp_path: Path) -> None:
    nvrtc = wheel_lib_paths("nvrtc")
    if not nvrtc:
        pytest.skip("NVRTC is not installed from a wheel here (a toolkit install)")
    site = nvrtc[0].parents[3]  # <site>/nvidia/<package>/lib/<library>
    if not (site / "nvidia").is_dir() or not (site / "cuda").is_dir():
        pytest.skip(f"the NVIDIA wheels and cuda-bindings are not installed side by side ({site})")
    target = tmp_path / "td-modules"  # what pip install --target makes: every package in one folder
    target.mkdir()
    for entry in site.iterdir():
        if entry.name != "cudapatch" and not entry.name.startswith("cudapatch-"):
            (target / entry.name).symlink_to(entry)
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False, symlinks=sys.platform != "win32").create(bare)
    python = bare / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(target)]))
    env.pop("CUDA_HOME", None)
    env.pop("CUDA_PATH", None)
    env.pop("LD_LIBRARY_PATH", None)
    out = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(got["where"]).is_relative_to(ROOT) and got["kinds"] == ["cubin", True]
    assert {"nvrtc", "nvJitLink"} <= set(got["present"])
    assert got["found"] == got["present"]  # every library on sys.path loads through pathfinder now
    if "nvrtc" not in got["missed"]:
        pytest.skip("this machine has NVRTC outside site-packages too: the target-folder case is not reproduced")
