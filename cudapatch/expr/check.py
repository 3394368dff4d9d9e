"""Names and types of an expression: which names are inputs, Hot scalars and built-ins, and the type
of every node.

Types (three, all 32 bits):

- ``float`` (f32): float literals (``1.5``, ``2e3``), inputs, Hot scalars, ``pi``, every math function.
- ``int`` (i32): integer literals (``3``), ``index`` (this element's index), ``count`` (the element
  count), ``int(x)`` (truncates toward zero).
- ``bool``: comparisons, ``and``, ``or``, ``not``; only ``where``'s condition and the logical
  operators take one.

Rules: ``+ - *`` and unary ``-`` keep ``int`` when every operand is ``int``, else compute in
``float`` (an ``int`` operand is converted). ``/`` and ``**`` always give ``float``. ``% & | ^ << >> ~``
take ``int`` only. ``min``, ``max``, ``abs``, ``clamp`` and ``where`` keep ``int`` when all their
values are ``int``. The result is stored as ``float``; a ``bool`` result is an error.

Names: where the caller does not declare them, a name starting with an upper-case letter is a Hot
scalar (``Freq``), any other an input buffer (``x``). A caller may declare some names (``declared``):
those are what they are declared as whatever their case, come first (in the order declared) and stay
even when the expression does not use them (``Checked.unused``); the rest follow the case rule. With
``closed``, a kind that has declared names has only those: a name the case rule would add to it is an
unknown name (a typo such as ``Freqq`` beside a declared ``Freq`` is an error, not a new scalar),
while a kind with none declared still takes names by case (``Inputs="c: float4"`` declares a vector
input without having to declare every Hot scalar).

Vector inputs (``lanes``: ``float2``/``float3``/``float4``, see ``vectors.py``) do not change the
types of nodes: the expression is typed once and computed lane by lane.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from .errors import ExpressionError
from .syntax import Binary, Call, Name, Node, Num, Unary, children, parse, start

__all__ = ["Checked", "FUNCTIONS", "BUILTIN_NAMES", "NameKind", "Type", "check", "compile_expression", "declare"]

Type = Literal["float", "int", "bool"]
NameKind = Literal["input", "scalar"]

#: Functions: name → (number of arguments, what the result is: "float" or "same" (int if all int)).
FUNCTIONS: dict[str, tuple[int, str]] = {
    "sin": (1, "float"),
    "cos": (1, "float"),
    "tan": (1, "float"),
    "exp": (1, "float"),
    "log": (1, "float"),
    "pow": (2, "float"),
    "sqrt": (1, "float"),
    "abs": (1, "same"),
    "floor": (1, "float"),
    "fract": (1, "float"),
    "min": (2, "same"),
    "max": (2, "same"),
    "clamp": (3, "same"),
    "mix": (3, "float"),
    "step": (2, "float"),
    "smoothstep": (3, "float"),
    "where": (3, "same"),
    "fma": (3, "float"),
    "int": (1, "int"),
    "float": (1, "float"),
}
#: Names with a meaning of their own: the element index, the element count, and pi.
BUILTIN_NAMES: dict[str, Type] = {"index": "int", "count": "int", "pi": "float"}

_INT_ONLY = {"%", "&", "|", "^", "<<", ">>", "~"}
_COMPARE = {"<", "<=", ">", ">=", "==", "!="}


@dataclass(frozen=True, eq=False)
class Checked:
    """A parsed and typed expression.

    Attributes:
        text: The expression as written.
        root: Its tree.
        inputs: Input buffer names: the declared ones in the order declared, then the others in order
            of first use.
        scalars: Hot scalar names, in the same order.
        types: ``id(node)`` → its type, for every node of ``root``.
        unused: Declared names the expression does not use (still inputs or scalars), in order.
        lanes: The lanes of each vector input (``float4`` → 4; ``float`` inputs are not listed). An
            expression with vector inputs computes lane by lane (``vectors.py``).
    """

    text: str
    root: Node
    inputs: tuple[str, ...]
    scalars: tuple[str, ...]
    types: dict[int, Type] = field(repr=False)
    unused: tuple[str, ...] = ()
    lanes: Mapping[str, int] = field(default_factory=dict)

    def type_of(self, node: Node) -> Type:
        return self.types[id(node)]

    @property
    def out_lanes(self) -> int:
        """The lanes of the result: those of the vector inputs, 1 without any."""
        return max(self.lanes.values(), default=1)

    def __reduce__(self) -> tuple:
        # ``types`` is keyed by node identity, which a pickle does not keep: an unpickled expression is
        # parsed and checked again from its text (descriptions travel to an isolated engine's child).
        return (_rebuild, (self.text, self.inputs, self.scalars, dict(self.lanes)))


def _rebuild(
    text: str, inputs: tuple[str, ...], scalars: tuple[str, ...], lanes: Mapping[str, int] | None = None
) -> Checked:
    names: dict[str, NameKind] = {**dict.fromkeys(inputs, "input"), **dict.fromkeys(scalars, "scalar")}
    # declared as well: the same order, and the names the expression does not use stay (and are ``unused``)
    return compile_expression(text, names=names, declared=names, lanes=lanes)


def _by_case(name: str) -> NameKind:
    return "scalar" if name[0].isupper() else "input"


def _kind(
    name: str, names: Mapping[str, NameKind] | None, declared: Mapping[str, NameKind], closed: bool
) -> NameKind | None:
    if names is not None:
        return names.get(name)
    kind = declared.get(name)
    if kind is not None:
        return kind
    kind = _by_case(name)
    if closed and kind in declared.values():  # this kind's names are all declared
        return None
    return kind


def _unknown_name(name: str, known: Iterable[str], col: int, *, closed_kind: NameKind | None) -> ExpressionError:
    """ "unknown name" with the known names listed, the closest to ``name`` first (a typo's fix leads),
    and, where ``name`` would have been a new input or scalar had that kind not been declared, how to
    make it one."""
    known = set(known) | set(BUILTIN_NAMES)
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
    listed = ", ".join([*close, *sorted(known - set(close))])
    hint = f", did you mean '{close[0]}'?" if close else ""
    if closed_kind is not None:
        listed += f"; {closed_kind}s are declared here: declare a new one too"
    return ExpressionError(f"unknown name '{name}'{hint} (known: {listed})", column=col)


class _Checker:
    def __init__(
        self,
        root: Node,
        names: Mapping[str, NameKind] | None,
        reserved: Mapping[str, str],
        declared: Mapping[str, NameKind],
        closed: bool,
    ) -> None:
        self.root = root
        self.names = names
        self.reserved = reserved
        self.declared = declared
        self.closed = closed
        self.inputs: dict[str, None] = {}
        self.scalars: dict[str, None] = {}
        self.types: dict[int, Type] = {}

    def visit(self, node: Node) -> Type:
        t = self._visit(node)
        self.types[id(node)] = t
        return t

    def _visit(self, node: Node) -> Type:
        if isinstance(node, Num):
            return "int" if node.is_int else "float"
        if isinstance(node, Name):
            return self._name(node)
        if isinstance(node, Unary):
            t = self.visit(node.operand)
            if node.op == "not":
                self._want_bool(node.operand, t, "not")
                return "bool"
            self._want_number(node.operand, t, node.op)
            if node.op == "~" and t != "int":
                raise self._int_only(node, node.operand, "~")
            return t
        if isinstance(node, Binary):
            return self._binary(node)
        if isinstance(node, Call):
            return self._call(node)
        raise AssertionError(node)

    def _name(self, node: Name) -> Type:
        n = node.id
        if n in FUNCTIONS:
            raise ExpressionError(f"'{n}' is a function: call it, as in {n}(x)", column=node.col)
        if n in self.reserved:
            raise ExpressionError(f"the name '{n}' is taken by {self.reserved[n]}: rename it", column=node.col)
        builtin = BUILTIN_NAMES.get(n)
        if builtin is not None:
            return builtin
        kind = _kind(n, self.names, self.declared, self.closed)
        if kind is None:
            if self.names is not None:
                raise _unknown_name(n, self.names, node.col, closed_kind=None)
            known = [*self.declared, *self._open_names()]
            raise _unknown_name(n, known, node.col, closed_kind=_by_case(n))
        (self.inputs if kind == "input" else self.scalars)[n] = None
        return "float"

    def _open_names(self) -> tuple[str, ...]:
        """The names of the whole expression that the case rule takes (their kind has none declared),
        for an unknown name's message: only an error needs them, so only an error walks the tree for them."""
        return tuple(
            n
            for n in _used_names(self.root)
            if n not in self.declared and n not in FUNCTIONS and n not in BUILTIN_NAMES and n not in self.reserved
            if _by_case(n) not in self.declared.values()
        )

    @staticmethod
    def _want_number(operand: Node, t: Type, op: str) -> None:
        if t == "bool":
            raise ExpressionError(
                f"'{op}' takes numbers, and this is true/false: use where(cond, a, b) to choose a number",
                column=start(operand),
            )

    @staticmethod
    def _want_bool(operand: Node, t: Type, op: str) -> None:
        if t != "bool":
            raise ExpressionError(f"'{op}' takes true/false (a comparison), and this is a {t}", column=start(operand))

    @staticmethod
    def _int_only(node: Node, operand: Node, op: str) -> ExpressionError:
        return ExpressionError(
            f"'{op}' takes integers, and this is a float: convert it with int(x), or use floor/fract",
            column=start(operand),
        )

    def _binary(self, node: Binary) -> Type:
        lt, rt = self.visit(node.left), self.visit(node.right)
        op = node.op
        if op in ("and", "or"):
            self._want_bool(node.left, lt, op)
            self._want_bool(node.right, rt, op)
            return "bool"
        self._want_number(node.left, lt, op)
        self._want_number(node.right, rt, op)
        if op in _COMPARE:
            return "bool"
        if op in _INT_ONLY:
            for side, t in ((node.left, lt), (node.right, rt)):
                if t != "int":
                    raise self._int_only(node, side, op)
            return "int"
        if op in ("/", "**"):
            return "float"
        return "int" if lt == rt == "int" else "float"

    def _call(self, node: Call) -> Type:
        spec = FUNCTIONS.get(node.func)
        if spec is None:
            if node.func in BUILTIN_NAMES or node.func in (self.names or self.declared):
                raise ExpressionError(f"'{node.func}' is a value, not a function", column=node.col)
            known = ", ".join(sorted(FUNCTIONS))
            raise ExpressionError(f"unknown function '{node.func}' (known: {known})", column=node.col)
        arity, result = spec
        if len(node.args) != arity:
            s = "" if arity == 1 else "s"
            raise ExpressionError(f"{node.func}() takes {arity} argument{s}, got {len(node.args)}", column=node.col)
        types = [self.visit(a) for a in node.args]
        values = list(zip(node.args, types, strict=True))
        if node.func == "where":
            self._want_bool(node.args[0], types[0], "where's condition")
            values = values[1:]
        for a, t in values:
            self._want_number(a, t, f"{node.func}()")
        if result == "same":
            return "int" if all(t == "int" for _, t in values) else "float"
        return result  # type: ignore[return-value]


def check(
    root: Node,
    text: str = "",
    *,
    names: Mapping[str, NameKind] | None = None,
    reserved: Mapping[str, str] | None = None,
    declared: Mapping[str, NameKind] | None = None,
    lanes: Mapping[str, int] | None = None,
    closed: bool = False,
) -> Checked:
    """Resolve names and types of a parsed expression.

    Args:
        root: The parsed tree.
        text: The text it came from (kept for messages and generated code).
        names: The names allowed, as ``input`` or ``scalar``; None: by case (``Freq`` a Hot scalar,
            ``x`` an input).
        reserved: Names that must not be used, with what holds them (``"the output port"``).
        declared: Names declared ``input`` or ``scalar`` whatever their case, in order: they come
            first among the inputs and scalars, and stay there when the expression does not use them
            (listed in ``Checked.unused``). The caller checks they are names (``declare``).
        lanes: Input name → its lanes, for vector inputs (``vectors.parse_declarations`` reads them
            from ``"c: float4"``); each must be an input, and all the same.
        closed: A kind (input, scalar) with ``declared`` names has only those: a name the case rule
            would make one more of that kind is an unknown name (listing the known ones, the closest
            first). A kind with no declared name still takes names by case.

    Raises:
        ExpressionError: an unknown name or function, a wrong argument count, a type error, a
            reserved name, a true/false result, a vector name that is no input or whose lanes differ
            from the others'; with the column.
    """
    declared = declared or {}
    c = _Checker(root, names, reserved or {}, declared, closed)
    t = c.visit(root)
    if t == "bool":
        raise ExpressionError(
            "the result is true/false: write where(cond, 1.0, 0.0) to make it a number", column=root.col
        )
    if not declared:
        inputs, scalars, unused = list(c.inputs), list(c.scalars), ()
    else:
        inputs = [n for n, k in declared.items() if k == "input"]
        scalars = [n for n, k in declared.items() if k == "scalar"]
        unused = tuple(n for n in declared if n not in c.inputs and n not in c.scalars)
        inputs += [n for n in c.inputs if n not in declared]
        scalars += [n for n in c.scalars if n not in declared]
    vectors = _vector_lanes(root, lanes or {}, inputs)
    return Checked(text, root, tuple(inputs), tuple(scalars), c.types, unused, vectors)


def _vector_lanes(root: Node, lanes: Mapping[str, int], inputs: list[str]) -> dict[str, int]:
    """The vector inputs' lanes, checked: inputs only, all alike (the error names the column where
    the expression first uses the offending name)."""
    out: dict[str, int] = {}
    first: str | None = None
    for name in inputs:
        n = lanes.get(name, 1)
        if n == 1:
            continue
        if n not in (2, 3, 4):
            raise ExpressionError(
                f"input '{name}' has {n} lanes: vector inputs have 2, 3 or 4", column=first_use(root, name)
            )
        if first is not None and out[first] != n:
            raise ExpressionError(
                f"input '{name}' has {n} lanes but '{first}' has {out[first]}: every vector input of one "
                "expression has the same lanes",
                column=first_use(root, name),
            )
        first = first or name
        out[name] = n
    for name, n in lanes.items():
        if n != 1 and name not in out:
            raise ExpressionError(f"'{name}' is declared a vector, but it is no input of the expression")
    return out


def _used_names(root: Node) -> dict[str, None]:
    """Every name the tree reads (not the functions it calls), once each."""
    out: dict[str, None] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, Name):
            out[node.id] = None
        stack.extend(children(node))
    return out


def first_use(root: Node, name: str) -> int | None:
    """The leftmost column where ``name`` appears in the tree, None where it does not."""
    best = None
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, Name) and node.id == name:
            best = node.col if best is None else min(best, node.col)
        stack.extend(children(node))
    return best


def declare(
    inputs: Iterable[str], scalars: Iterable[str], *, reserved: Mapping[str, str] | None = None
) -> dict[str, NameKind]:
    """The ``declared`` argument of ``check`` for these input and scalar names, checked.

    Raises:
        ExpressionError: a name that is no identifier, a function's or a built-in's name, a reserved
            name, or a name declared both an input and a scalar (naming it).
    """
    out: dict[str, NameKind] = {}
    reserved = reserved or {}
    for kind, names in (("input", inputs), ("scalar", scalars)):
        for n in names:
            if not (n.isascii() and n.isidentifier()):
                raise ExpressionError(f"'{n}' is not a name (letters, digits and _, not starting with a digit)")
            if n in FUNCTIONS:
                raise ExpressionError(f"'{n}' is a function: it cannot be declared {_AN[kind]}")
            if n in BUILTIN_NAMES:
                raise ExpressionError(f"'{n}' is a built-in name: it cannot be declared {_AN[kind]}")
            if n in reserved:
                raise ExpressionError(f"the name '{n}' is taken by {reserved[n]}: rename it")
            if out.get(n, kind) != kind:
                raise ExpressionError(f"'{n}' is declared both an input and a scalar: keep it in one of them")
            out[n] = kind  # type: ignore[assignment]
    return out


_AN = {"input": "an input", "scalar": "a scalar"}


def compile_expression(
    text: str,
    *,
    names: Mapping[str, NameKind] | None = None,
    reserved: Mapping[str, str] | None = None,
    declared: Mapping[str, NameKind] | None = None,
    lanes: Mapping[str, int] | None = None,
    closed: bool = False,
) -> Checked:
    """``parse`` then ``check`` (see there).

    Raises:
        ExpressionError: with the column.
    """
    return check(parse(text), text, names=names, reserved=reserved, declared=declared, lanes=lanes, closed=closed)
