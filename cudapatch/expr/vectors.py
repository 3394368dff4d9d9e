"""Vector element types of expressions: which types an input may have, and declarations that give them.

An expression computes in ``float``; an input may also be a vector of floats (``float2``, ``float3``,
``float4``), declared with its type: ``Inputs="c: float4, mask"``. Such an expression computes lane by
lane (``Out.x = f(c.x, mask)``, ``Out.y = f(c.y, mask)`` ...) and its output has the vector type. The
rules:

- every vector input of one expression has the same lane count (``float2`` beside ``float4`` is an
  error naming the second one, at its column in the declaration);
- a ``float`` input is read once per element and broadcast across that element's lanes; an input of
  one element is read by every element, as for scalar expressions; Hot scalars are floats and
  broadcast to every lane;
- ``index`` and ``count`` count elements, not lanes;
- other element types (``uchar4``, ``int``, ``half`` ...) are refused: the language's values are
  32-bit floats and ints, and a ``uchar4`` would need a conversion on load and a rounding, clamping
  store the language has no way to say. Hot scalars take ``float`` only.

Types are declared, not taken from what is linked: a block's ports are typed when it is described,
before any link is known, and a link between ports of different element types is refused.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..kernels.types import DType
from .errors import ExpressionError

__all__ = ["EXPRESSION_TYPES", "LANE_BY_LANE", "LANE_NAMES", "Declaration", "parse_declarations", "vector_dtype"]

#: The element types an expression input may have, by name.
EXPRESSION_TYPES: dict[str, DType] = {
    "float": DType.FLOAT32,
    "float2": DType.FLOAT2,
    "float3": DType.FLOAT3,
    "float4": DType.FLOAT4,
}
#: The lanes' names in CUDA's vector types.
LANE_NAMES = "xyzw"
#: How the generated code's header says a vector program runs.
LANE_BY_LANE = "lane by lane over"

_BY_LANES = {dt.lanes: dt for dt in EXPRESSION_TYPES.values()}

# one comma-separated item: a name, optionally ": type" (the type may be several words: "unsigned int")
_ITEM = re.compile(r"\s*(?P<name>[^:,]*?)\s*(?::\s*(?P<type>[^,]*?)\s*)?(?:,|$)")


def vector_dtype(lanes: int) -> DType:
    """The element type of ``lanes`` float lanes (1 → ``float``, 4 → ``float4``)."""
    return _BY_LANES[lanes]


class Declaration(NamedTuple):
    """One declared name, its lanes (1 for ``float``) and the 1-based column where the name starts."""

    name: str
    lanes: int
    column: int


def parse_declarations(text: str, *, what: str = "input", vectors: bool = True) -> list[Declaration]:
    """The names of a comma-separated declaration (``"c: float4, mask"``) with their lanes.

    Names are not checked here (``check.declare`` does). ``vectors=False`` (Hot scalars) allows
    ``float`` only.

    Raises:
        ExpressionError: an unknown type, a type expressions do not compute in, a vector type where
            ``vectors`` is off, or vector names of different lanes; with the column in ``text``.
    """
    out: list[Declaration] = []
    first_vector: Declaration | None = None
    pos = 0
    while pos < len(text):
        m = _ITEM.match(text, pos)
        assert m is not None  # the pattern matches anything up to the next comma or the end
        end = m.end()
        if end == pos:  # nothing consumed (the text is exhausted)
            break
        pos = end
        name = m.group("name")
        type_name = m.group("type")
        if not name and type_name is None:
            continue  # an empty item ("a,,b" or a trailing comma)
        col = m.start("name") + 1
        lanes = 1
        if type_name is not None:
            lanes = _lanes(type_name, m.start("type") + 1, name, what, vectors)
        d = Declaration(name, lanes, col)
        if lanes > 1:
            if first_vector is not None and first_vector.lanes != lanes:
                raise ExpressionError(
                    f"{what} '{name}' is {vector_dtype(lanes).c_name} but '{first_vector.name}' is "
                    f"{vector_dtype(first_vector.lanes).c_name}: every vector input of one expression has the "
                    "same lanes",
                    column=col,
                )
            first_vector = first_vector or d
        out.append(d)
    return out


def _lanes(type_name: str, col: int, name: str, what: str, vectors: bool) -> int:
    known = EXPRESSION_TYPES if vectors else {"float": DType.FLOAT32}
    dt = known.get(type_name)
    if dt is not None:
        return dt.lanes
    listed = ", ".join(known)
    if not type_name:
        raise ExpressionError(f"{what} '{name}': a type is missing after ':' ({listed})", column=col)
    try:
        DType.from_c_name(type_name)
    except KeyError:
        raise ExpressionError(f"unknown type '{type_name}' for {what} '{name}' (known: {listed})", column=col) from None
    if not vectors:
        why = "Hot scalars are floats"
    elif type_name in ("uchar4",):
        why = "expressions compute in float: give them images as float4 (the image blocks' Format = rgba32f)"
    else:
        why = "expressions compute in float and float vectors"
    raise ExpressionError(f"{what} '{name}' cannot be {type_name}: {why} ({listed})", column=col)
