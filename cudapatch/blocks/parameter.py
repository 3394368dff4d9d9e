"""BlockParameter: a typed, range-checked scalar with change events (a text parameter too; either
may be limited to a tuple of choices)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ParameterError
from ..kernels._text import short_repr
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

    Setting ``value`` checks type, range and choices; a bad value raises ``ParameterError`` naming
    block and parameter and leaves the old value. A parameter with choices takes a choice or a string
    naming one (other case or spacing; ``"16"`` for 16) and holds the choice itself. Listeners are
    called with ``(parameter)`` after a change.
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
            if spec.choices:
                self._fast = None  # every value is looked up among the choices
                self._check_choices()
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
        if spec.choices:
            self._fast = None  # every value is looked up among the choices
            self._check_choices()

    def _check_choices(self) -> None:
        """Refuse choices a parameter of this type cannot hold, twins, and a default that is no choice."""
        spec = self.spec
        if spec.kind == "scalar" and (spec.dtype is None or spec.dtype.lanes != 1 or spec.dtype.base.kind not in "iu"):
            raise self._error("only text and integer parameters take choices")
        names = [" ".join(str(c).split()).casefold() for c in spec.choices]
        if len(set(names)) != len(names):
            raise self._error(f"choices must differ in more than case and spacing: {self._names()}")
        text = spec.kind == "text"
        for c in spec.choices:
            if text and not isinstance(c, str):
                raise self._error(f"the choices of a text parameter are strings, not {short_repr(c)}")
            if not text:
                if not isinstance(c, int) or isinstance(c, bool):
                    raise self._error(f"the choices of an integer parameter are integers, not {short_repr(c)}")
                self._check_range(self._coerce(c), c)
        if self._value not in spec.choices:
            raise self._error(f"the default {short_repr(spec.default)} is not one of its choices: {self._names()}")

    def _names(self) -> str:
        return ", ".join(str(c) for c in self.spec.choices)

    def _error(self, message: str) -> ParameterError:
        return ParameterError(message, block=self.block_name, param=self.spec.name)

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
            ParameterError: wrong type, out of range, or not one of the choices.
        """
        spec = self.spec
        if type(new) is self._fast and new == new:  # not NaN
            if (self._lo is None or new >= self._lo) and (self._hi is None or new <= self._hi):
                return new
        if spec.kind == "text" and not isinstance(new, str):
            raise ParameterError(f"must be text, got {type(new).__name__}", block=self.block_name, param=spec.name)
        if spec.choices:
            picked = spec.choice(new)
            if picked is None:
                if spec.kind == "scalar" and not isinstance(new, str):
                    self._coerce(new)  # a value of the wrong type says so
                raise self._error(f"{short_repr(new)} is not one of its choices: {self._names()}")
            return picked
        v = self._coerce(new)
        self._check_range(v, new)
        return v

    def _check_range(self, v: ScalarValue, new: Any) -> None:
        spec = self.spec
        lanes = v if isinstance(v, tuple) else (v,)
        for lane in lanes:
            if (spec.minimum is not None and lane < spec.minimum) or (spec.maximum is not None and lane > spec.maximum):
                raise ParameterError(
                    f"value {new!r} is out of range [{spec.minimum}, {spec.maximum}]",
                    block=self.block_name,
                    param=spec.name,
                )

    def _coerce(self, new: Any) -> ScalarValue:
        assert self.spec.dtype is not None
        try:
            return coerce_scalar(new, self.spec.dtype)
        except ParameterError as exc:
            raise self._error(exc.message) from None

    def set(self, new: Any) -> None:
        """Validate and set; listeners run only if the value changed.

        Raises:
            ParameterError: wrong type, out of range or not a choice (the old value stays).
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
