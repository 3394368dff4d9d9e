"""What a new user reads when something is missing: ``cudapatch run``, the examples and ``Engine()``
without a driver, and each line of ``cudapatch check``. Most failures are simulated by replacing
preflight's loaders (``_load_driver``, ``_load_library``) or the engine's driver module, so these
tests say the same on any machine; the library failures are the strings cuda.pathfinder raised on a
machine without the libraries, and on a machine without a driver (this one, in CI) the commands also
run for real in a subprocess."""

from __future__ import annotations

import enum
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cudapatch import preflight
from cudapatch._examples import EXIT_ERROR, EXIT_NO_CUDA, example_main
from cudapatch.cli import main
from cudapatch.engine import device as device_module
from cudapatch.errors import CudaError, CudaUnavailableError, InteropError, KernelLoadError
from cudapatch.kernels._driver import LIBCUDA, bindings_major, driver_needed, no_driver_message

from ..conftest import gpu_unavailable_reason

ROOT = Path(__file__).resolve().parents[2]

NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE


class CUresult(enum.IntEnum):
    """The cuInit results these tests need, named like cuda-bindings' enum (whose members have ``.name``)."""

    CUDA_SUCCESS = 0
    CUDA_ERROR_INSUFFICIENT_DRIVER = 35
    CUDA_ERROR_NO_DEVICE = 100


def fake_driver(*, init: Any = 0, version: int = 13000, devices: int = 1) -> SimpleNamespace:
    """A stand-in for ``cuda.bindings.driver``: ``init`` is cuInit's result, or an exception it raises."""

    def cu_init(flags: int) -> tuple[Any]:
        if isinstance(init, BaseException):
            raise init
        return (init,)

    attrs = SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76
    )
    capability = {75: 9, 76: 0}
    return SimpleNamespace(
        CUresult=SimpleNamespace(CUDA_ERROR_NO_DEVICE=NO_DEVICE),
        CUdevice_attribute=attrs,
        cuInit=cu_init,
        cuDriverGetVersion=lambda: (0, version),
        cuDeviceGetCount=lambda: (0, devices),
        cuDeviceGet=lambda i: (0, i),
        cuDeviceGetName=lambda n, dev: (0, b"NVIDIA H100 80GB HBM3\0\0"),
        cuDeviceGetAttribute=lambda attr, dev: (0, capability[attr]),
    )


NO_LIBCUDA = RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search. Ensure the '
                          "NVIDIA display driver is installed.")  # fmt: skip


@pytest.fixture
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver(init=NO_LIBCUDA))
    monkeypatch.setattr(preflight, "_cuda_major", lambda: 13)  # the default wheels, whatever is installed


def item(items: list[preflight.CheckItem], name: str) -> preflight.CheckItem:
    (found,) = [i for i in items if i.name == name]
    return found


# -- no driver: cudapatch run and the examples -----------------------------------------------------
def test_without_a_driver_the_line_names_the_driver_and_cudapatch_check(no_driver: None) -> None:
    line = preflight.explain_unavailable(CudaUnavailableError("no CUDA driver: ..."))
    assert "\n" not in line
    assert "no NVIDIA driver" in line and "libcuda" in line or "nvcuda" in line
    assert "CUDA 13 (R580 or newer)" in line and "`cudapatch check`" in line
    assert line.lower().count("install") == 1  # not the bindings' "is installed" as well


def test_cudapatch_run_without_a_driver_prints_one_line(
    no_driver: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cudapatch.host_plugin.hosts import standalone

    def no_engine(*args: Any, **kwargs: Any) -> None:  # what Engine() raises on a machine without a driver
        raise CudaUnavailableError(no_driver_message())

    monkeypatch.setattr(standalone, "StandaloneHost", no_engine)
    assert main(["run", "--headless", "--frames", "3"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    (line,) = out.err.splitlines()
    assert line.startswith("cudapatch: no NVIDIA driver") and "R580" in line and "`cudapatch check`" in line
    assert line.lower().count("install") == 1


def test_cudapatch_run_keeps_other_errors_as_they_are(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from cudapatch.host_plugin.hosts import standalone

    def bad_kernel(*args: Any, **kwargs: Any) -> None:
        raise KernelLoadError("no such kernel", file="k.cu", line=3)

    monkeypatch.setattr(standalone, "StandaloneHost", bad_kernel)
    assert main(["run", "--headless", "--frames", "3"]) == 2
    assert capsys.readouterr().err == "cudapatch: k.cu:3: no such kernel\n"


def test_an_example_main_without_cuda_prints_one_line_and_returns_non_zero(
    no_driver: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["examples/01_vector_add.py", "--frames", "3"])

    @example_main
    def script(frames: int) -> int:
        """A script's main."""
        raise CudaUnavailableError("no CUDA driver: ...")

    assert script.__doc__ == "A script's main."  # functools.wraps: --help texts built from it keep working
    assert script(3) == EXIT_NO_CUDA != 0
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("01_vector_add.py: no NVIDIA driver") and "`cudapatch check`" in line


def test_an_example_main_keeps_results_and_other_errors() -> None:
    assert example_main(lambda: 0)() == 0
    assert example_main(lambda: 1)() == 1

    @example_main
    def broken() -> int:
        raise ValueError("a bug: keeps its traceback")

    with pytest.raises(ValueError, match="a bug"):
        broken()


def test_an_example_main_prints_other_cudapatch_errors_as_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["examples/03_particles.py"])

    @example_main
    def windowed() -> int:
        raise InteropError("no display: DISPLAY is unset; run with --headless")

    assert windowed() == EXIT_ERROR != EXIT_NO_CUDA
    assert capsys.readouterr().err == "03_particles.py: no display: DISPLAY is unset; run with --headless\n"

    @example_main
    def driver_call() -> int:  # a driver call that failed on a machine with CUDA: a bug, keeps its traceback
        raise CudaError("CUDA_ERROR_INVALID_VALUE: invalid argument (in cuGraphLaunch)")

    with pytest.raises(CudaError):
        driver_call()


# numba-cuda's own error text on a machine without a driver (numba-cuda 0.30)
NUMBA_NO_DRIVER = "Error at driver init: \n\nCUDA driver library cannot be found.\n"


def _raising_inside(module: str) -> Any:
    """A function whose frame belongs to ``module``, raising numba's no-driver error as if numba raised it."""
    scope: dict[str, Any] = {"__name__": module, "text": NUMBA_NO_DRIVER}
    exec(compile("def call():\n    raise RuntimeError(text)\n", f"{module.replace('.', '/')}.py", "exec"), scope)
    return scope["call"]


def test_an_example_main_explains_a_gpu_library_error_on_a_machine_without_cuda(
    no_driver: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["examples/04_library_calls.py"])
    script = example_main(_raising_inside("numba.cuda.cudadrv.driver"))
    assert script() == EXIT_NO_CUDA
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("04_library_calls.py: no NVIDIA driver") and "R580 or newer" in line
    # the same error raised by the script itself, or by a GPU library on a machine with CUDA, is not explained away
    with pytest.raises(RuntimeError, match="driver init"):
        example_main(_raising_inside("__main__"))()
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver())
    with pytest.raises(RuntimeError, match="driver init"):
        script()


def test_without_cuda_bindings_the_line_says_what_to_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise ImportError("No module named 'cuda'")

    monkeypatch.setattr(preflight, "_load_driver", missing)
    line = preflight.explain_unavailable(CudaUnavailableError("cuda-bindings is not installed"))
    major = bindings_major()  # 13 with the default wheels, 12 where the CUDA 12 ones are installed
    assert "cuda-bindings cannot be imported" in line
    assert f"pip install 'cuda-bindings[all]>={major},<{major + 1}'" in line
    assert "`cudapatch check`" in line and line.lower().count("install") == 1
    assert item(preflight.preflight(), "cuda-bindings").ok is False


def test_without_a_device_the_line_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver(init=NO_DEVICE))
    line = preflight.explain_unavailable(
        CudaUnavailableError("the NVIDIA driver reports no CUDA device; see `cudapatch check`")
    )
    assert line.startswith("the driver reports no CUDA device") and "`cudapatch check`" in line
    driver = item(preflight.preflight(), "driver")
    assert not driver.ok and driver.fix == "this machine needs an NVIDIA GPU"


def test_other_unavailable_errors_keep_their_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver())
    line = preflight.explain_unavailable(CudaUnavailableError("CUDA device 3 requested but only 1 device(s) present"))
    assert line == "CUDA device 3 requested but only 1 device(s) present. See `cudapatch check`"


def test_a_driver_too_old_for_the_bindings_says_which_one_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver(init=CUresult.CUDA_ERROR_INSUFFICIENT_DRIVER))
    monkeypatch.setattr(preflight, "_cuda_major", lambda: 13)
    line = preflight.explain_unavailable(CudaUnavailableError("..."))
    assert line == (
        "the NVIDIA driver is too old (cuInit: CUDA_ERROR_INSUFFICIENT_DRIVER): update to an NVIDIA driver for "
        "CUDA 13 (R580 or newer), then run `cudapatch check`"
    )
    driver = item(preflight.preflight(), "driver")
    assert not driver.ok and driver.detail == "too old for cuda-bindings 13 (cuInit: CUDA_ERROR_INSUFFICIENT_DRIVER)"
    assert (
        driver.fix
        == "update to an NVIDIA driver for CUDA 13 (R580 or newer), or use the CUDA 12 wheels (docs/setup.md)"
    )


# -- Engine() itself: what a script of the user's own sees -----------------------------------------
def test_the_engine_without_a_driver_words_it_as_cudapatch_check_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_module, "driver", lambda: fake_driver(init=NO_LIBCUDA))
    with pytest.raises(CudaUnavailableError) as info:
        device_module.DeviceContext()
    text = str(info.value)
    assert (
        text
        == f"no NVIDIA driver ({LIBCUDA} could not be loaded): install {driver_needed()}, then run `cudapatch check`"
    )
    assert text.lower().count("install") == 1 and "Ensure" not in text  # not the bindings' text as well
    # one source of truth: check's fix and the one line of cudapatch run name the same driver
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver(init=NO_LIBCUDA))
    assert item(preflight.preflight(), "driver").fix == f"install {driver_needed()}"
    assert preflight.explain_unavailable(info.value) == text


def test_the_engine_with_a_driver_too_old_says_which_one_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_module, "driver", lambda: fake_driver(init=CUresult.CUDA_ERROR_INSUFFICIENT_DRIVER))
    with pytest.raises(CudaUnavailableError, match="too old .*CUDA_ERROR_INSUFFICIENT_DRIVER.*`cudapatch check`"):
        device_module.DeviceContext()
    monkeypatch.setattr(device_module, "driver", lambda: fake_driver(init=CUresult.CUDA_ERROR_NO_DEVICE))
    with pytest.raises(CudaUnavailableError, match="reports no CUDA device; see `cudapatch check`"):
        device_module.DeviceContext()


def test_the_driver_each_cuda_major_needs() -> None:
    assert driver_needed(13) == "an NVIDIA driver for CUDA 13 (R580 or newer)"
    assert driver_needed(12) == "an NVIDIA driver for CUDA 12 (R525 or newer)"
    assert driver_needed(14) == "an NVIDIA driver for CUDA 14"  # no branch known yet: no number made up


def test_with_cuda_12_bindings_the_messages_name_the_cuda_12_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver(init=NO_LIBCUDA))
    monkeypatch.setattr(preflight, "_cuda_major", lambda: 12)
    assert "install an NVIDIA driver for CUDA 12 (R525 or newer)" in preflight.cuda_unavailable_line()
    assert item(preflight.preflight(), "driver").fix == "install an NVIDIA driver for CUDA 12 (R525 or newer)"
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver(version=11080))
    driver = item(preflight.preflight(), "driver")
    assert driver.fix == "update to an NVIDIA driver for CUDA 12 (R525 or newer)"  # no "use the CUDA 12 wheels"


# -- this machine, for real: without a driver, through the command line ----------------------------
def _no_driver_here() -> None:
    reason = gpu_unavailable_reason()
    if reason is None or not reason.startswith("no CUDA driver"):
        pytest.skip(f"this machine has a CUDA driver ({reason or 'and a GPU'})")


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def test_cudapatch_run_on_a_machine_without_a_driver() -> None:
    _no_driver_here()
    out = _python("-m", "cudapatch", "run", "--headless", "--frames", "3")
    assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
    (line,) = out.stderr.splitlines()
    assert line == f"cudapatch: {no_driver_message()}"  # the installed cuda-bindings' CUDA
    assert driver_needed() in line and line.lower().count("install") == 1 and "`cudapatch check`" in line


def test_engine_on_a_machine_without_a_driver() -> None:
    _no_driver_here()
    out = _python("-c", "import cudapatch; cudapatch.Engine()")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == f"cudapatch.errors.CudaUnavailableError: {no_driver_message()}", out.stderr


# -- cudapatch check: the driver lines -------------------------------------------------------------
def test_check_without_a_driver_names_the_version_it_needs(no_driver: None) -> None:
    driver = item(preflight.preflight(), "driver")
    assert not driver.ok and not driver.optional
    assert driver.detail.startswith("not found (") and "Ensure" not in driver.detail  # not the bindings' text
    assert driver.fix == "install an NVIDIA driver for CUDA 13 (R580 or newer)"


def test_check_with_a_driver_lists_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver(version=13000, devices=1))
    monkeypatch.setattr(preflight, "_cuda_major", lambda: 13)
    items = preflight.preflight()
    assert item(items, "driver") == preflight.CheckItem("driver", True, "CUDA 13.0")
    assert item(items, "gpu 0").detail == "NVIDIA H100 80GB HBM3 (sm_90)"


def test_check_with_a_cuda_12_driver_and_cuda_13_wheels_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver(version=12080))
    monkeypatch.setattr(preflight, "_cuda_major", lambda: 13)
    driver = item(preflight.preflight(), "driver")
    assert not driver.ok and driver.detail.startswith("CUDA 12.8: cuda-bindings 13 needs a newer one")
    assert "R580 or newer" in driver.fix and "docs/setup.md" in driver.fix


# -- cudapatch check: one line per math library ----------------------------------------------------
class DynamicLibNotFoundError(RuntimeError):
    """Named like cuda.pathfinder's error (the message format is pathfinder's too)."""


def loader(missing: dict[str, str], broken: dict[str, str] | None = None) -> Any:
    """A ``_load_library`` stand-in: ``missing`` maps a library to the file pathfinder fails to find."""

    def load(name: str) -> str:
        if name in missing:
            raise DynamicLibNotFoundError(
                f'Failure finding "{missing[name]}": No such file: {missing[name]}\n  listdir("/site/nvidia/cu13/lib"):'
                "\n    libnvrtc.so.13"
            )
        if broken and name in broken:
            raise OSError(broken[name])
        return f"/site/nvidia/cu13/lib/lib{name}.so"

    return load


def library_items(monkeypatch: pytest.MonkeyPatch, load: Any, major: int = 13) -> dict[str, preflight.CheckItem]:
    monkeypatch.setattr(preflight, "_load_library", load)
    monkeypatch.setattr(preflight, "_cuda_major", lambda: major)
    return {i.name: i for i in preflight._library_items()}


# What cuda.pathfinder 1.9.1 raised, verbatim, on a machine with cuda-bindings 13 and none of the
# math libraries (only the NVRTC/nvJitLink wheels in nvidia/cu13/lib): cuSOLVER fails on cuSPARSE,
# which it loads first, and cuBLAS on cuBLASLt.
_LISTDIR = (
    '\n  listdir("/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/cu13/lib"):\n'
    "    libcufile.so.0\n    libcufile_rdma.so.1\n    libnvJitLink.so.13\n    libnvfatbin.so.13\n"
    "    libnvrtc-builtins.so.13.5\n    libnvrtc.so.13\n    libnvvm.so.4"
)
PATHFINDER_FAILURES = {
    name: f'Failure finding "{files}": No such file: {files}, No such file: {files}{_LISTDIR}'
    for name, files in {
        "cusolver": "libcusparse.so.12",
        "cusparse": "libcusparse.so.12",
        "cublas": "libcublasLt.so.13 or libcublasLt.so.12",
        "cublasLt": "libcublasLt.so.13 or libcublasLt.so.12",
        "cufft": "libcufft.so.12 or libcufft.so.11",
        "curand": "libcurand.so.11 or libcurand.so.10",
    }.items()
}


def test_check_on_a_machine_without_the_libraries_says_what_each_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    def load(name: str) -> str:
        if name in PATHFINDER_FAILURES:
            raise DynamicLibNotFoundError(PATHFINDER_FAILURES[name])
        return f"/site/nvidia/cu13/lib/lib{name}.so.13"  # nvJitLink is there

    items = library_items(monkeypatch, load)
    got = {name: (i.detail, i.fix) for name, i in items.items()}
    fix = "pip install \"cuda-toolkit[{}]==13.*\" (all five libraries: the 'libs' extra)"
    assert got == {
        "cuBLAS": (
            "cuBLASLt, a library cuBLAS depends on, is missing: libcublasLt.so.13 or libcublasLt.so.12 not found",
            fix.format("cublas"),
        ),
        "cuFFT": ("libcufft.so.12 or libcufft.so.11 not found", fix.format("cufft")),
        "cuRAND": ("libcurand.so.11 or libcurand.so.10 not found", fix.format("curand")),
        "cuSOLVER": (
            "cuSPARSE, a library cuSOLVER depends on, is missing: libcusparse.so.12 not found",
            fix.format("cusolver,cusparse"),
        ),
        "cuSPARSE": ("libcusparse.so.12 not found", fix.format("cusparse")),
    }
    assert all(not i.ok and i.optional and "\n" not in i.detail for i in items.values())


def test_a_library_cusolver_depends_on_is_named_with_its_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    # This machine's case: cuSOLVER's own loader fails on libcusparse.so.12, which cuSOLVER loads first.
    items = library_items(monkeypatch, loader({"cusolver": "libcusparse.so.12", "cusparse": "libcusparse.so.12"}))
    solver = items["cuSOLVER"]
    assert not solver.ok and solver.optional
    assert solver.detail == "cuSPARSE, a library cuSOLVER depends on, is missing: libcusparse.so.12 not found"
    assert solver.fix == "pip install \"cuda-toolkit[cusolver,cusparse]==13.*\" (all five libraries: the 'libs' extra)"
    assert items["cuSPARSE"].detail == "libcusparse.so.12 not found"
    assert "cuda-toolkit[cusparse]" in items["cuSPARSE"].fix
    assert items["cuBLAS"] == preflight.CheckItem("cuBLAS", True, "/site/nvidia/cu13/lib/libcublas.so", optional=True)


def test_cublas_without_cublaslt_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    lt = "libcublasLt.so.13 or libcublasLt.so.12"
    items = library_items(monkeypatch, loader({"cublas": lt, "cublasLt": lt}))
    assert items["cuBLAS"].detail == f"cuBLASLt, a library cuBLAS depends on, is missing: {lt} not found"
    assert 'cuda-toolkit[cublas]==13.*"' in items["cuBLAS"].fix
    assert all(i.ok for name, i in items.items() if name != "cuBLAS")


def test_a_missing_library_itself_and_a_broken_one(monkeypatch: pytest.MonkeyPatch) -> None:
    items = library_items(monkeypatch, loader({"cufft": "libcufft.so.12 or libcufft.so.11"}, {"curand": "bad ELF\nx"}))
    assert items["cuFFT"].detail == "libcufft.so.12 or libcufft.so.11 not found"
    assert items["cuFFT"].fix.startswith('pip install "cuda-toolkit[cufft]==13.*"')
    assert items["cuRAND"].detail == "libcurand failed to load: bad ELF"
    assert "cuda-toolkit[curand]" in items["cuRAND"].fix


def _cuda12_recipe_libraries() -> str:
    """The quoted ``cuda-toolkit`` requirement of docs/setup.md's CUDA 12 recipe (the bash block with cupy-cuda12x)."""
    setup = (ROOT / "docs" / "setup.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```bash\n(.*?)^```", setup, re.S | re.M)
    recipe = next(block for block in blocks if "cupy-cuda12x" in block)
    (line,) = [line for line in recipe.splitlines() if "cuda-toolkit[" in line]
    assert line.startswith("python3 -m pip install ")
    (requirement,) = re.findall(r'"cuda-toolkit\[[^\]]+\]==12\.\*"', line)
    return requirement


def test_with_cuda_12_bindings_the_fix_names_the_cuda_12_wheels(monkeypatch: pytest.MonkeyPatch) -> None:
    items = library_items(monkeypatch, loader({"cufft": "libcufft.so.11"}), major=12)
    every = _cuda12_recipe_libraries()
    assert every == '"cuda-toolkit[cublas,cufft,curand,cusolver,cusparse]==12.*"'
    # No extra: pip cannot install one without the package's CUDA 13 dependencies (docs/setup.md says why),
    # so the fix for all five is the command the docs' CUDA 12 recipe runs.
    assert items["cuFFT"].fix == (
        f'pip install "cuda-toolkit[cufft]==12.*" (all five libraries: pip install {every}, see docs/setup.md)'
    )
    assert "extra" not in items["cuFFT"].fix


def test_check_prints_each_library_with_what_is_missing_and_the_fix(
    no_driver: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(preflight, "_load_library", loader({"cusolver": "libcusparse.so.12", "cusparse": "x"}))
    monkeypatch.setattr(preflight, "_cuda_major", lambda: 13)
    assert main(["check"]) == 1  # no driver is not optional
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("--  cuSOLVER"))
    assert "cuSPARSE, a library cuSOLVER depends on, is missing" in lines[at]
    assert (
        lines[at + 1]
        == "      fix: pip install \"cuda-toolkit[cusolver,cusparse]==13.*\" (all five libraries: the 'libs' extra)"
    )
    assert any(line.startswith("!!  driver") for line in lines)
    assert "      fix: install an NVIDIA driver for CUDA 13 (R580 or newer)" in lines


def test_the_python_line_states_the_real_floor() -> None:
    python = item(preflight.preflight(), "python")
    assert python.ok and python.fix == "use Python 3.11 or newer"
