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
    assert calls.raw is None  # (a stand-in's calls take handles)


def test_a_replaced_bindings_function_is_used_as_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.bindings import driver as bindings

    monkeypatch.setattr(_driver, "_driver", bindings)
    held = {"cuGraphExecKernelNodeSetParams": object(), "cuGraphNodeSetEnabled": object()}
    monkeypatch.setattr(held_calls, "_held", held)  # as resolved where the driver gives the entry points
    replaced = lambda ex, n, on: (0,)  # noqa: E731 - a test's stand-in (an injected failure, say)
    monkeypatch.setattr(bindings, "cuGraphNodeSetEnabled", replaced)
    calls = held_calls.frame_calls()
    assert calls.set_enabled is replaced  # the replacement, even where it came before the first look
    assert calls.set_params is held["cuGraphExecKernelNodeSetParams"] and calls.launch is bindings.cuGraphLaunch
    monkeypatch.undo()
    monkeypatch.setattr(_driver, "_driver", bindings)
    monkeypatch.setattr(held_calls, "_held", held)
    assert held_calls.frame_calls().set_enabled is held["cuGraphNodeSetEnabled"]  # held again once put back


def test_no_held_calls_where_the_entry_points_or_their_struct_are_not_there(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from cuda.bindings import driver as bindings

    monkeypatch.setattr(held_calls, "_said", False)

    def refused(name: bytes, version: int, flags: int) -> tuple:
        raise RuntimeError("no driver")

    no_driver = types.SimpleNamespace(
        CUDA_KERNEL_NODE_PARAMS=bindings.CUDA_KERNEL_NODE_PARAMS,
        CUDA_KERNEL_NODE_PARAMS_v2=bindings.CUDA_KERNEL_NODE_PARAMS_v2,
        cuGetProcAddress=refused,
    )
    with caplog.at_level("INFO", logger="cudapatch.kernels"):
        assert held_calls._resolve(no_driver) is None
    assert "cuGetProcAddress(cuGraphExecKernelNodeSetParams) failed: no driver" in caplog.text
    other_struct = types.SimpleNamespace(
        CUDA_KERNEL_NODE_PARAMS=bindings.CUDA_KERNEL_NODE_PARAMS_v1,
        CUDA_KERNEL_NODE_PARAMS_v2=bindings.CUDA_KERNEL_NODE_PARAMS_v2,
        cuGetProcAddress=lambda *a: pytest.fail("asked for an entry point whose struct is not the bindings'"),
    )
    assert held_calls._resolve(other_struct) is None


def test_the_calls_on_plain_values_come_with_both_held_calls_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.bindings import driver as bindings

    def entry(*args: int) -> int:
        return 0

    def other(*args: int) -> int:
        return 0

    monkeypatch.setattr(_driver, "_driver", bindings)
    monkeypatch.setattr(
        held_calls, "_held", held_calls._wrap({"cuGraphExecKernelNodeSetParams": entry, "cuGraphNodeSetEnabled": other})
    )
    raw = held_calls.frame_calls().raw
    assert raw is not None and raw.set_params is entry and raw.set_enabled is other  # the entry points themselves
    monkeypatch.setattr(bindings, "cuGraphExecKernelNodeSetParams", lambda ex, n, p: (0,))  # a test's injected failure
    calls = held_calls.frame_calls()
    assert (
        calls.raw is None and calls.set_enabled is held_calls._held["cuGraphNodeSetEnabled"]
    )  # both on handles, or none


def test_held_calls_pass_handle_values_and_the_parameters_address() -> None:
    seen: list[tuple] = []

    def entry(*args: int) -> int:
        seen.append(args)
        return 0

    wrapped = held_calls._wrap({"cuGraphExecKernelNodeSetParams": entry, "cuGraphNodeSetEnabled": entry})
    exec_, node = _Handle(0x1000), _Handle(0x2000)
    assert wrapped["cuGraphExecKernelNodeSetParams"](exec_, node, _Params()) == (0,)
    assert wrapped["cuGraphNodeSetEnabled"](exec_, node, 1) == (0,)
    assert wrapped["cuGraphNodeSetEnabled"](None, node, 0) == (0,)  # a closed graph's: NULL, refused by the driver
    assert seen == [(0x1000, 0x2000, 0x5000), (0x1000, 0x2000, 1), (0, 0x2000, 0)]


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
