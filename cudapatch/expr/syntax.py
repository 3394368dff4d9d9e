"""The expression language's syntax: a tokenizer and a precedence-climbing parser.

A small hand parser rather than Python's ``ast``: every node keeps the 1-based column it starts at,
the grammar is exactly the language (no attribute access, lambdas or comprehensions to refuse), and
parsing is linear in the text. The grammar, loosest binding first::

    expr       := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | compare
    compare    := bitor (("<" | "<=" | ">" | ">=" | "==" | "!=") bitor)?
    bitor      := bitxor ("|" bitxor)*
    bitxor     := bitand ("^" bitand)*
    bitand     := shift ("&" shift)*
    shift      := sum (("<<" | ">>") sum)*
    sum        := product (("+" | "-") product)*
    product    := unary (("*" | "/" | "%") unary)*
    unary      := ("-" | "+" | "~") unary | power
    power      := atom ("**" unary)?
    atom       := number | name | name "(" [expr ("," expr)*] ")" | "(" expr ")"

Operators associate to the left (``**`` to the right, as in Python). Comparisons do not chain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ExpressionError

__all__ = [
    "children",
    "start",
    "Node",
    "Num",
    "Name",
    "Unary",
    "Binary",
    "Call",
    "parse",
    "MAX_EXPRESSION_CHARS",
    "MAX_DEPTH",
]

#: The longest expression accepted (an expression is typed into a field; this bounds the work).
MAX_EXPRESSION_CHARS = 16_384
#: How deep parentheses and operators may nest (Python's recursion stays far away).
MAX_DEPTH = 150

_TOKEN = re.compile(
    r"(?P<ws>[ \t\r\n]+)"
    r"|(?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>\*\*|<<|>>|<=|>=|==|!=|[-+*/%<>()&|^~,])"
)
_KEYWORDS = {"and", "or", "not"}


@dataclass(frozen=True, eq=False)
class Node:
    """A node of the expression tree; ``col`` is the 1-based column where it starts. Compared by
    identity (a fused plan shares subtrees)."""

    col: int


@dataclass(frozen=True, eq=False)
class Num(Node):
    """A number literal; ``is_int`` for literals written without ``.`` or exponent."""

    value: float | int
    is_int: bool


@dataclass(frozen=True, eq=False)
class Name(Node):
    """A name: an input, a Hot scalar or a built-in (``index``, ``count``, ``pi``)."""

    id: str


@dataclass(frozen=True, eq=False)
class Unary(Node):
    """``-x``, ``+x``, ``~x`` or ``not x``."""

    op: str
    operand: Node


@dataclass(frozen=True, eq=False)
class Binary(Node):
    """``left op right`` for arithmetic, bitwise, comparison and logical operators."""

    op: str
    left: Node
    right: Node


@dataclass(frozen=True, eq=False)
class Call(Node):
    """``func(args...)``."""

    func: str
    args: tuple[Node, ...]


def start(node: Node) -> int:
    """The column where ``node``'s text starts (a binary node's ``col`` is its operator's)."""
    while isinstance(node, Binary):
        node = node.left
    return node.col


@dataclass(frozen=True)
class _Tok:
    kind: str  # num, name, op, end
    text: str
    col: int


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos, n = 0, len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:
            ch = text[pos]
            hint = " (write a ** b for powers, or pow(a, b))" if ch == "^" else ""
            if ch in "[]{}.:;=!?'\"@$#\\":
                hint = {"=": " (use == to compare)", "!": " (use not, or != to compare)"}.get(ch, "")
            raise ExpressionError(f"unexpected character {ch!r}{hint}", column=pos + 1)
        kind = m.lastgroup
        assert kind is not None
        if kind != "ws":
            tok = m.group()
            if kind == "name" and tok in _KEYWORDS:
                kind = "op"
            out.append(_Tok(kind, tok, pos + 1))
        pos = m.end()
    out.append(_Tok("end", "", n + 1))
    return out


# Binding strength of the binary operators (higher binds tighter); "not" sits between "and" and the comparisons.
_PREC = {"or": 1, "and": 2, "|": 5, "^": 6, "&": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10}
_PREC.update(dict.fromkeys(("<", "<=", ">", ">=", "==", "!="), 4))
_NOT_PREC = 3
_COMPARE_PREC = 4


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, text: str, what: str) -> _Tok:
        t = self.tok
        if t.text != text or t.kind != "op":
            found = "the end of the expression" if t.kind == "end" else repr(t.text)
            raise ExpressionError(f"expected {what}, found {found}", column=t.col)
        return self.take()

    def nest(self, col: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExpressionError(f"the expression nests deeper than {MAX_DEPTH} levels", column=col)

    def binary(self, min_prec: int) -> Node:
        """Precedence climbing: one call per nesting level, not one per operator level."""
        left = self.prefix()
        compared = False
        while True:
            t = self.tok
            prec = _PREC.get(t.text) if t.kind == "op" else None
            if prec is None or prec < min_prec:
                return left
            if prec == _COMPARE_PREC:
                if compared:
                    raise ExpressionError("comparisons do not chain: write (a < b) and (b < c)", column=t.col)
                compared = True
            self.take()
            right = self.binary(prec + 1)
            left = Binary(t.col, t.text, left, right)

    def prefix(self) -> Node:
        t = self.tok
        if t.kind == "op" and t.text == "not":
            self.take()
            self.nest(t.col)
            node = Unary(t.col, "not", self.binary(_NOT_PREC))
            self.depth -= 1
            return node
        return self.unary()

    def unary(self) -> Node:
        t = self.tok
        if t.kind == "op" and t.text in ("-", "+", "~"):
            self.take()
            self.nest(t.col)
            node = Unary(t.col, t.text, self.unary())
            self.depth -= 1
            return node
        return self.power()

    def power(self) -> Node:
        base = self.atom()
        if self.tok.kind == "op" and self.tok.text == "**":
            t = self.take()
            self.nest(t.col)
            node = Binary(t.col, "**", base, self.unary())
            self.depth -= 1
            return node
        return base

    def atom(self) -> Node:
        t = self.take()
        if t.kind == "num":
            is_int = not any(c in t.text for c in ".eE")
            if is_int:
                value: float | int = int(t.text) if len(t.text) <= 12 else 2**40
                if value > 2**31 - 1:
                    raise ExpressionError(f"integer {t.text} does not fit 32 bits (write {t.text}.0)", column=t.col)
            else:
                value = float(t.text)
            return Num(t.col, value, is_int)
        if t.kind == "name":
            if self.tok.kind == "op" and self.tok.text == "(":
                self.take()
                self.nest(t.col)
                args: list[Node] = []
                if not (self.tok.kind == "op" and self.tok.text == ")"):
                    args.append(self.binary(0))
                    while self.tok.kind == "op" and self.tok.text == ",":
                        self.take()
                        args.append(self.binary(0))
                self.expect(")", f"',' or ')' to close the call of {t.text}()")
                self.depth -= 1
                return Call(t.col, t.text, tuple(args))
            return Name(t.col, t.text)
        if t.kind == "op" and t.text == "(":
            self.nest(t.col)
            node = self.binary(0)
            self.expect(")", "')'")
            self.depth -= 1
            return node
        if t.kind == "end":
            raise ExpressionError("the expression ends too early: a value is missing", column=t.col)
        raise ExpressionError(f"expected a value, found {t.text!r}", column=t.col)


def parse(text: str) -> Node:
    """Parse ``text`` into an expression tree (syntax only; ``check`` does names and types).

    Raises:
        ExpressionError: a syntax error, with the 1-based ``column`` where it is.
    """
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"the expression has {len(text)} characters (at most {MAX_EXPRESSION_CHARS})", column=1)
    body = text.rstrip()
    if "\n" in body or "\r" in body:
        raise ExpressionError("an expression is one line", column=re.search(r"[\r\n]", body).start() + 1)  # type: ignore[union-attr]
    p = _Parser(text)
    if p.tok.kind == "end":
        raise ExpressionError("the expression is empty", column=1)
    node = p.binary(0)
    if p.tok.kind != "end":
        t = p.tok
        raise ExpressionError(f"unexpected {t.text!r} after a complete expression", column=t.col)
    _check_depth(node)
    return node


def children(node: Node) -> tuple[Node, ...]:
    """The operands of ``node`` (none for a number or a name)."""
    if isinstance(node, Binary):
        return (node.left, node.right)
    if isinstance(node, Unary):
        return (node.operand,)
    if isinstance(node, Call):
        return node.args
    return ()


def _check_depth(root: Node) -> None:
    """Refuse trees deeper than ``MAX_DEPTH`` (a sum of hundreds of terms nests as deep), so checking
    and code generation, which recurse, stay far from Python's recursion limit."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ExpressionError(
                f"the expression nests deeper than {MAX_DEPTH} operations: split it over several blocks",
                column=node.col,
            )
        stack.extend((child, depth + 1) for child in children(node))
