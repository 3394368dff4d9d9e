"""The frame path's held driver calls (``kernels.held_calls``), without a GPU: which functions a graph
gets, how the held ones pass handles and parameters, and how a plain int error code is named."""

from __future__ import annotations

import types

import pytest

from cudapatch.errors import CudaError, CudaLaunchError
from cudapatch.kernels import _driver, held_calls
from cudapatch.kernels._driver import check


class _Handle:
    """A bindings handle: ``int()`` is its value."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


class _Params:
    """A bindings parameter struct: ``getPtr()`` is its address."""

    def getPtr(self) -> int:  # noqa: N802 - the bindings' name
        return 0x5000


def test_a_stand_in_driver_gets_its_own_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in = types.SimpleNamespace(
        cuGraphLaunch=lambda ex, st: (0,),
        cuGraphExecKernelNodeSetParams=lambda ex, n, p: (0,),
        cuGraphNodeSetEnabled=lambda ex, n, on: (0,),
    )
    monkeypatch.setattr(_driver, "_driver", stand_in)
    calls = held_calls.frame_calls()
    assert calls.launch is stand_in.cuGraphLaunch  # (the launch is never held)
    assert calls.set_params is stand_in.cuGraphExecKernelNodeSetParams
    assert calls.set_enabled is stand_in.cuGraphNodeSetEnabled


def test_a_replaced_bindings_function_is_used_as_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.bindings import driver as bindings

    monkeypatch.setattr(_driver, "_driver", bindings)
    replaced = lambda ex, n, on: (0,)  # noqa: E731 - a test's stand-in (an injected failure, say)
    monkeypatch.setattr(bindings, "cuGraphNodeSetEnabled", replaced)
    calls = held_calls.frame_calls()
    assert calls.set_enabled is replaced and calls.launch is bindings.cuGraphLaunch
    # The other: held where this machine's driver gives its entry point, else the bindings' own.
    assert calls.set_params is bindings.cuGraphExecKernelNodeSetParams or calls.set_params.__name__.startswith("held")


def test_held_calls_pass_handle_values_and_the_parameters_address() -> None:
    seen: list[tuple] = []

    def entry(*args: int) -> int:
        seen.append(args)
        return 0

    wrapped = held_calls._wrap({"cuGraphExecKernelNodeSetParams": entry, "cuGraphNodeSetEnabled": entry})
    exec_, node = _Handle(0x1000), _Handle(0x2000)
    assert wrapped["cuGraphExecKernelNodeSetParams"](exec_, node, _Params()) == (0,)
    assert wrapped["cuGraphNodeSetEnabled"](exec_, node, 1) == (0,)
    assert seen == [(0x1000, 0x2000, 0x5000), (0x1000, 0x2000, 1)]


def test_a_plain_int_error_code_is_named_as_the_driver_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.bindings import driver as bindings

    def name_of(err: object) -> tuple:
        assert isinstance(err, bindings.CUresult), "the driver's functions take the enum"
        return (bindings.CUresult.CUDA_SUCCESS, err.name.encode())

    stand_in = types.SimpleNamespace(
        CUresult=bindings.CUresult,
        cuGetErrorName=name_of,
        cuGetErrorString=lambda err: (bindings.CUresult.CUDA_SUCCESS, b"the driver's text"),
    )
    monkeypatch.setattr(_driver, "_driver", stand_in)
    with pytest.raises(CudaLaunchError) as info:  # sticky: the engine recovers from it as from the enum's
        check((int(bindings.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS),), "cuGraphLaunch")
    assert info.value.name == "CUDA_ERROR_ILLEGAL_ADDRESS" and "cuGraphLaunch" in str(info.value)
    with pytest.raises(CudaError) as info:
        check((int(bindings.CUresult.CUDA_ERROR_INVALID_VALUE),), "cuGraphNodeSetEnabled")
    assert info.value.name == "CUDA_ERROR_INVALID_VALUE" and type(info.value) is CudaError
