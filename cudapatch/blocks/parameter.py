"""BlockParameter: a typed, range-checked scalar with change events."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ParameterError
from ..kernels.types import DType
from .description import ParamSpec, ScalarValue

__all__ = ["BlockParameter", "coerce_scalar"]

# The range of every integer lane type, from NumPy (a table written out by hand missed the 8- and
# 16-bit types added later).
_INT_RANGES = {d: (int(np.iinfo(d.base).min), int(np.iinfo(d.base).max)) for d in DType if d.base.kind in "iu"}


def _coerce_lane(value: Any, dtype: DType, what: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ParameterError(f"{what} must be a number, got {type(value).__name__} {value!r}")
    if dtype.base.kind == "f":
        v = float(value)
        if math.isnan(v):
            raise ParameterError(f"{what} must not be NaN")
        return v
    if isinstance(value, numbers.Integral):
        iv = int(value)
    elif float(value).is_integer():
        iv = int(value)
    else:
        raise ParameterError(f"{what} must be an integer ({dtype.c_name}), got {value!r}")
    lo, hi = _INT_RANGES[dtype]
    if not lo <= iv <= hi:
        raise ParameterError(f"{what} {iv} does not fit a {dtype.c_name} ({lo}..{hi})")
    return iv


def coerce_scalar(value: Any, dtype: DType, *, what: str = "value") -> ScalarValue:
    """Check and convert ``value`` to a Python value of ``dtype`` (a tuple for vector types).

    Raises:
        ParameterError: wrong type, wrong number of components, NaN, or not representable.
    """
    if dtype.lanes == 1:
        return _coerce_lane(value, dtype, what)
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise ParameterError(f"{what} must be a sequence of {dtype.lanes} numbers ({dtype.c_name}), got {value!r}")
    if len(value) != dtype.lanes:
        raise ParameterError(f"{what} must have {dtype.lanes} components ({dtype.c_name}), got {len(value)}")
    return tuple(_coerce_lane(v, dtype, f"{what} component {i}") for i, v in enumerate(value))


class BlockParameter:
    """A scalar parameter of a block instance.

    Setting ``value`` checks type and range; a bad value raises ``ParameterError`` naming block and
    parameter and leaves the old value. Listeners are called with ``(parameter)`` after a change.
    """

    __slots__ = ("spec", "block_name", "_value", "_listeners", "_fast", "_lo", "_hi")

    def __init__(self, spec: ParamSpec, block_name: str) -> None:
        self.spec = spec
        self.block_name = block_name
        # Fast path for the common case (a Python float into a float, an int into an int): the
        # Hot tier's budget is a few microseconds, and the general coercion costs about one.
        dt = spec.dtype
        self._fast: type | None = None
        if spec.kind == "text":
            self._fast, self._lo, self._hi = str, None, None
            if not isinstance(spec.default, str):
                raise ParameterError(
                    "the default of a text parameter must be a string", block=block_name, param=spec.name
                )
            self._value = spec.default
            self._listeners = []
            return
        assert dt is not None
        if dt.lanes == 1:
            self._fast = float if dt.base.kind == "f" else int
        lo, hi = _INT_RANGES.get(dt, (None, None))
        self._lo = lo if spec.minimum is None else (spec.minimum if lo is None else max(lo, spec.minimum))
        self._hi = hi if spec.maximum is None else (spec.maximum if hi is None else min(hi, spec.maximum))
        try:
            self._value: ScalarValue = coerce_scalar(spec.default, spec.dtype, what="default value")
        except ParameterError as exc:
            raise ParameterError(exc.message, block=block_name, param=spec.name) from None
        self._listeners: list[Callable[[BlockParameter], None]] = []

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def dtype(self) -> DType | None:
        return self.spec.dtype

    @property
    def value(self) -> ScalarValue:
        """The current value."""
        return self._value

    @value.setter
    def value(self, new: Any) -> None:
        self.set(new)

    def validate(self, new: Any) -> ScalarValue:
        """The coerced value, or ParameterError (nothing changes).

        Raises:
            ParameterError: wrong type or out of range.
        """
        spec = self.spec
        if type(new) is self._fast and new == new:  # not NaN
            if (self._lo is None or new >= self._lo) and (self._hi is None or new <= self._hi):
                return new
        if spec.kind == "text":
            raise ParameterError(f"must be text, got {type(new).__name__}", block=self.block_name, param=spec.name)
        assert spec.dtype is not None
        try:
            v = coerce_scalar(new, spec.dtype)
        except ParameterError as exc:
            raise ParameterError(exc.message, block=self.block_name, param=spec.name) from None
        lanes = v if isinstance(v, tuple) else (v,)
        for lane in lanes:
            if (spec.minimum is not None and lane < spec.minimum) or (spec.maximum is not None and lane > spec.maximum):
                raise ParameterError(
                    f"value {new!r} is out of range [{spec.minimum}, {spec.maximum}]",
                    block=self.block_name,
                    param=spec.name,
                )
        return v

    def set(self, new: Any) -> None:
        """Validate and set; listeners run only if the value changed.

        Raises:
            ParameterError: wrong type or out of range (the old value stays).
        """
        lo, hi = self._lo, self._hi
        if type(new) is self._fast and new == new and (lo is None or new >= lo) and (hi is None or new <= hi):
            v = new  # ``validate``'s first test, here: a slider's value takes no call (the Hot budget)
        else:
            v = self.validate(new)
        if v == self._value:
            return
        self._value = v
        for fn in self._listeners:
            fn(self)

    def subscribe(self, fn: Callable[[BlockParameter], None]) -> None:
        """Call ``fn(parameter)`` after every change."""
        self._listeners.append(fn)

    def unsubscribe(self, fn: Callable[[BlockParameter], None]) -> None:
        """Stop calling ``fn``; unknown functions are ignored."""
        if fn in self._listeners:
            self._listeners.remove(fn)

    def __repr__(self) -> str:
        return f"<BlockParameter {self.block_name}.{self.name}: {self.dtype.c_name} = {self._value!r}>"
