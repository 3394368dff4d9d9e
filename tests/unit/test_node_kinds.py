"""The node-kind table (no GPU): every plan node type has a kind, an unknown one is a clear error, and
planned arguments resolve to the values a graph's nodes are built with."""

from __future__ import annotations

import typing

import pytest

from cudapatch import CudapatchError, DType
from cudapatch.engine import ExternalBinding
from cudapatch.engine.captured_calls import CapturedCalls
from cudapatch.engine.nodes import NODE_KINDS, NodeBuild, add_node, arg_value
from cudapatch.engine.params import StoreLoans
from cudapatch.engine.plan import Arg, NodePlan, PublishNodePlan, StampNodePlan


class _Buffer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def _build(**kw) -> NodeBuild:
    fields = {"graph": None, "device": None, "buffers": [], "bindings": {}, "functions": {}, "names": {}}
    fields.update(stores=StoreLoans({}), calls=CapturedCalls(None), scalars=None)
    return NodeBuild(**{**fields, **kw})


def test_every_plan_node_type_has_a_kind() -> None:
    assert set(typing.get_args(NodePlan)) == set(NODE_KINDS)


def test_an_unknown_node_kind_is_named() -> None:
    class ConditionalNodePlan(typing.NamedTuple):
        index: int
        deps: tuple[int, ...] = ()

    with pytest.raises(CudapatchError, match="no node kind for ConditionalNodePlan"):
        add_node(_build(), ConditionalNodePlan(0), [])  # type: ignore[arg-type]


def test_profiling_nodes_need_their_kernels() -> None:
    with pytest.raises(CudapatchError, match="timestamp kernel"):
        add_node(_build(), StampNodePlan(0, 0), [])
    with pytest.raises(CudapatchError, match="publish kernel"):
        add_node(_build(), PublishNodePlan(0), [])


def test_arguments_resolve_to_the_graphs_addresses_and_values() -> None:
    f32 = DType.FLOAT32
    buffers = [_Buffer(0x1000), _Buffer(0x2000)]
    bindings = {(3, "In"): ExternalBinding(0x9000, 10, f32)}

    def value(a: Arg):
        return arg_value(a, buffers, bindings, 0x5000)  # type: ignore[arg-type]

    assert value(Arg("buffer", f32, True, 1)) == 0x2000
    assert value(Arg("external", f32, True, (3, "In"))) == 0x9000
    assert value(Arg("counter", DType.UINT32, True, 2)) == 0x5000 + 4 * 2  # uint32 counters, packed
    assert value(Arg("null", f32, True)) == 0
    assert value(Arg("scalar", f32, False, (3, "Factor"), 1.5)) == 1.5
    assert value(Arg("const", DType.UINT32, False, None, 10)) == 10
    build = _build(buffers=buffers, bindings=bindings, counters_ptr=0x5000)
    assert build.value(Arg("counter", DType.UINT32, True, 0)) == 0x5000
