"""What a new user reads when something is missing: ``cudapatch run`` and the examples without a
driver, and each line of ``cudapatch check``. The failures are simulated by replacing preflight's
loaders (``_load_driver``, ``_load_library``), so these tests say the same on any machine."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cudapatch import preflight
from cudapatch._examples import EXIT_NO_CUDA, example_main
from cudapatch.cli import main
from cudapatch.errors import CudaUnavailableError, KernelLoadError

NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE


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
        raise CudaUnavailableError(f"no CUDA driver: {NO_LIBCUDA} (install the NVIDIA driver)")

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


def test_without_cuda_bindings_the_line_says_what_to_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise ImportError("No module named 'cuda'")

    monkeypatch.setattr(preflight, "_load_driver", missing)
    line = preflight.explain_unavailable(CudaUnavailableError("cuda-bindings is not installed"))
    assert "cuda-bindings cannot be imported" in line and "pip install 'cuda-bindings[all]>=13,<14'" in line
    assert "`cudapatch check`" in line and line.lower().count("install") == 1
    assert item(preflight.preflight(), "cuda-bindings").ok is False


def test_without_a_device_the_line_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver(init=NO_DEVICE))
    line = preflight.explain_unavailable(
        CudaUnavailableError("the CUDA driver is installed but reports no CUDA device")
    )
    assert line.startswith("the driver reports no CUDA device") and "`cudapatch check`" in line
    driver = item(preflight.preflight(), "driver")
    assert not driver.ok and driver.fix == "this machine needs an NVIDIA GPU"


def test_other_unavailable_errors_keep_their_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "_load_driver", lambda: fake_driver())
    line = preflight.explain_unavailable(CudaUnavailableError("CUDA device 3 requested but only 1 device(s) present"))
    assert line == "CUDA device 3 requested but only 1 device(s) present. See `cudapatch check`"


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


def test_a_library_cusolver_depends_on_is_named_with_its_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    # This machine's case: cuSOLVER's own loader fails on libcusparse.so.12, which cuSOLVER loads first.
    items = library_items(monkeypatch, loader({"cusolver": "libcusparse.so.12", "cusparse": "libcusparse.so.12"}))
    solver = items["cuSOLVER"]
    assert not solver.ok and solver.optional
    assert solver.detail == "cuSPARSE, a library cuSOLVER depends on, is missing: libcusparse.so.12 not found"
    assert solver.fix == "pip install \"cuda-toolkit[cusparse]==13.*\" (all five libraries: the 'libs' extra)"
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


def test_with_cuda_12_bindings_the_fix_names_the_cuda_12_wheels(monkeypatch: pytest.MonkeyPatch) -> None:
    items = library_items(monkeypatch, loader({"cufft": "libcufft.so.11"}), major=12)
    assert items["cuFFT"].fix == "pip install \"cuda-toolkit[cufft]==12.*\" (all five libraries: the 'libs-cu12' extra)"


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
        == "      fix: pip install \"cuda-toolkit[cusparse]==13.*\" (all five libraries: the 'libs' extra)"
    )
    assert any(line.startswith("!!  driver") for line in lines)
    assert "      fix: install an NVIDIA driver for CUDA 13 (R580 or newer)" in lines


def test_the_python_line_states_the_real_floor() -> None:
    python = item(preflight.preflight(), "python")
    assert python.ok and python.fix == "use Python 3.11 or newer"
