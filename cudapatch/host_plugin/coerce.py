"""Host values to parameter values: what a host's parameter field holds is not always the type the
block wants (TouchDesigner gives menu strings, ints for toggles, tuples for XYZ pars; TOML gives
lists). ``coerce_host_value`` converts, and leaves precise errors to the parameter's own checks."""

from __future__ import annotations

import re
from typing import Any

from ..blocks.description import ParamSpec
from ..errors import ParameterError
from ..kernels._text import short_repr

__all__ = ["coerce_host_value"]

_TRUE = {"on", "true", "yes"}
_FALSE = {"off", "false", "no"}
_SPLIT = re.compile(r"[\s,;]+")
_MAX_LANES = 16  # more components than any vector type has


def _number(text: str, want_int: bool, name: str) -> Any:
    t = text.strip()
    low = t.lower()
    if low in _TRUE:
        return 1
    if low in _FALSE:
        return 0
    try:
        value = int(t, 0) if want_int else float(t)
    except ValueError:  # also a decimal integer of more than 4,300 digits, which int() refuses
        if want_int:
            try:
                f = float(t)
            except ValueError:
                return text
            value = int(f) if f.is_integer() else text
        else:
            return text  # the parameter's check names the bad value
    if isinstance(value, int) and value.bit_length() > 64:  # "0xfff…" has no digit limit: stop it here
        raise ParameterError(f"{short_repr(text)} is too large for an integer parameter (64 bits at most)", param=name)
    return value


def _check_shape(spec: ParamSpec, value: Any) -> None:
    """Refuse what no number parameter takes, before anything tries to convert it: a table, a date,
    a list of lists, a list longer than any vector type (a patch file can hold all of them)."""
    items = value if isinstance(value, (list, tuple)) else (value,)
    if len(items) > _MAX_LANES:
        raise ParameterError(
            f"expected a number or up to {_MAX_LANES} numbers, got a list of {len(items)} values", param=spec.name
        )
    for item in items:
        if not isinstance(item, (str, int, float)):
            what = "a table" if isinstance(item, dict) else "a list" if isinstance(item, (list, tuple)) else None
            what = what or f"a {type(item).__name__}"
            raise ParameterError(f"expected a number, got {what}: {short_repr(item)}", param=spec.name)


def coerce_host_value(spec: ParamSpec, value: Any) -> Any:
    """Convert a host value for parameter ``spec``: strings to numbers (``"0.5"``, ``"On"``, a TD menu
    entry such as ``"PerBlock"`` stays a string for text parameters), ``"1 2 3"`` / ``"(1, 2, 3)"`` /
    lists to tuples for vector parameters, bools to 0/1. A parameter with choices takes a choice's
    name (a menu entry: ``"nvrtc"``, ``"16"``, in any case) and gets the choice. Values that cannot
    convert are passed on unchanged so the parameter's own check raises its precise error.

    Raises:
        ParameterError: a value no number parameter takes (a table, a date, nested or long lists).
    """
    kind = type(value)
    if (kind is float or kind is int) and spec.kind != "text" and not spec.choices:  # a slider's value, every frame
        dtype = spec.dtype
        if dtype is not None and dtype.lanes == 1:  # what the general path below gives it, without its tests
            if kind is float and dtype.base.kind in "iu" and value.is_integer():
                return int(value)
            return value
    if spec.choices:
        picked = spec.choice(value)
        if picked is not None:
            return picked
    if spec.kind == "text":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        return value
    _check_shape(spec, value)
    dtype = spec.dtype
    assert dtype is not None
    want_int = dtype.base.kind in "iu"
    if isinstance(value, bool):
        return int(value) if want_int else float(value)
    if dtype.lanes > 1:
        if isinstance(value, str):
            parts = [p for p in _SPLIT.split(value.strip().strip("()[]")) if p]
            return tuple(_number(p, want_int, spec.name) for p in parts)
        if isinstance(value, list):
            return tuple(value)
        return value
    if isinstance(value, str):
        return _number(value, want_int, spec.name)
    if want_int and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return coerce_host_value(spec, value[0])
    return value


def check_param(block: Any, name: str) -> ParamSpec:
    """The spec of parameter ``name`` of ``block``.

    Raises:
        ParameterError: no such parameter (the block's parameters are listed).
    """
    spec = block.description.param(name)
    if spec is None:
        known = ", ".join(p.name for p in block.description.params) or "none"
        raise ParameterError(f"unknown parameter (this block has: {known})", block=block.name, param=name)
    return spec
