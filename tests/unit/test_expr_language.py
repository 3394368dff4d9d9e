"""The expression language without a GPU: parsing, names, type rules and error columns."""

from __future__ import annotations

import pytest

from cudapatch.errors import KernelLoadError
from cudapatch.expr import ExpressionError, caret, compile_expression, parse
from cudapatch.expr.syntax import MAX_DEPTH, Binary, Call, Name, Num, Unary


def _error(text: str, **kwargs: object) -> ExpressionError:
    with pytest.raises(ExpressionError) as info:
        compile_expression(text, **kwargs)  # type: ignore[arg-type]
    return info.value


def test_precedence_and_associativity() -> None:
    t = parse("a + b * c ** 2 ** 3 - d")
    assert isinstance(t, Binary) and t.op == "-"
    add = t.left
    assert isinstance(add, Binary) and add.op == "+" and isinstance(add.left, Name)
    mul = add.right
    assert isinstance(mul, Binary) and mul.op == "*"
    pw = mul.right
    assert isinstance(pw, Binary) and pw.op == "**" and isinstance(pw.right, Binary) and pw.right.op == "**"
    neg = parse("-x ** 2")
    assert isinstance(neg, Unary) and isinstance(neg.operand, Binary)  # -(x ** 2), as in Python
    logic = parse("not a < b and c > d or e == f")
    assert isinstance(logic, Binary) and logic.op == "or"
    assert isinstance(logic.left, Binary) and logic.left.op == "and"
    assert isinstance(logic.left.left, Unary) and logic.left.left.op == "not"


def test_nodes_know_their_columns() -> None:
    t = parse("a * sin(x * Freq) + 1.5")
    assert isinstance(t, Binary) and t.col == 19
    call = t.left.right  # type: ignore[attr-defined]
    assert isinstance(call, Call) and call.col == 5 and call.func == "sin"
    assert isinstance(call.args[0], Binary) and call.args[0].left.col == 9  # type: ignore[attr-defined]
    num = t.right
    assert isinstance(num, Num) and num.value == 1.5 and not num.is_int and num.col == 21
    assert parse("3").is_int and not parse("3e2").is_int  # type: ignore[attr-defined]


def test_names_by_case_and_in_order_of_first_use() -> None:
    c = compile_expression("a * sin(x * Freq) + b + a * Gain")
    assert c.inputs == ("a", "x", "b")
    assert c.scalars == ("Freq", "Gain")
    declared = compile_expression("gain * X", names={"gain": "scalar", "X": "input"})
    assert declared.inputs == ("X",) and declared.scalars == ("gain",)
    assert compile_expression("index + count * pi").inputs == ()


@pytest.mark.parametrize(
    ("text", "column", "words"),
    [
        ("a +", 4, "ends too early"),
        ("a + * b", 5, "expected a value"),
        ("(a + b", 7, "')'"),
        ("a b", 3, "after a complete expression"),
        ("a = b", 3, "=="),
        ("a ^^ b", 4, "expected a value"),
        ("sin(a, b)", 1, "takes 1 argument"),
        ("a < b < c", 7, "do not chain"),
        ("a $ b", 3, "unexpected character"),
        ("", 1, "empty"),
        ("a +\nb", 4, "one line"),
        ("f(x, 1", 7, "close the call"),
    ],
)
def test_syntax_errors_give_the_column(text: str, column: int, words: str) -> None:
    err = _error(text)
    assert err.column == column, err
    assert words in err.message
    assert f"(column {column})" in str(err)
    assert isinstance(err, KernelLoadError)  # hosts that catch kernel errors catch these


def test_unknown_function_lists_the_known_ones() -> None:
    err = _error("a * sinn(x)")
    assert err.column == 5 and "unknown function 'sinn'" in err.message
    for name in ("sin", "cos", "smoothstep", "where", "clamp", "mix", "fract", "pow"):
        assert name in err.message


def test_unknown_name_lists_the_known_ones_when_names_are_declared() -> None:
    err = _error("In * Factr + Offset", names={"In": "input", "Factor": "scalar", "Offset": "scalar"})
    assert err.column == 6 and "unknown name 'Factr'" in err.message
    assert "Factor" in err.message and "In" in err.message and "index" in err.message
    assert "did you mean 'Factor'? (known: Factor, " in err.message  # the closest first


def test_closed_declarations_make_a_new_name_of_a_declared_kind_unknown() -> None:
    declared = {"x": "input", "Freq": "scalar"}
    err = _error("x * Freqq + y", declared=declared, closed=True)
    assert err.column == 5 and "unknown name 'Freqq', did you mean 'Freq'?" in err.message
    assert "(known: Freq, count, index, pi, x; scalars are declared here: declare a new one too)" in err.message
    err = _error("x * Freq + yy", declared={"x": "input"}, closed=True)  # scalars not declared: Freq by case
    assert err.column == 12 and "unknown name 'yy'" in err.message and "Freq" in err.message
    assert "did you mean" not in err.message  # nothing close: the names in order
    err = _error("x(2) + Freq", declared=declared, closed=True)
    assert err.column == 1 and "'x' is a value, not a function" in err.message
    opened = compile_expression("x * Freqq + y", declared=declared)  # not closed: the case rule adds them
    assert opened.inputs == ("x", "y") and opened.scalars == ("Freq", "Freqq")
    some = compile_expression("x * Gain + y", declared={"x": "input", "y": "input"}, closed=True)
    assert some.scalars == ("Gain",) and some.unused == ()


@pytest.mark.parametrize(
    ("text", "column", "words"),
    [
        ("x % 2", 1, "takes integers"),
        ("index % x", 9, "takes integers"),
        ("x << 1", 1, "takes integers"),
        ("~x", 2, "takes integers"),
        ("x < 1", 3, "true/false"),
        ("where(x, 1, 2)", 7, "true/false"),
        ("(x < 1) + 2", 2, "takes numbers"),
        ("not x", 5, "takes true/false"),
        ("sin", 1, "is a function"),
        ("index(2)", 1, "is a value"),
        ("x + Out", 5, "taken by the output port"),
    ],
)
def test_type_and_name_errors_give_the_column(text: str, column: int, words: str) -> None:
    err = _error(text, reserved={"Out": "the output port"})
    assert err.column == column, err
    assert words in err.message, err.message


def test_type_rules() -> None:
    def root_type(text: str) -> str:
        c = compile_expression(text)
        return c.type_of(c.root)

    assert root_type("index + 1") == "int"
    assert root_type("index * 2 - count % 3") == "int"
    assert root_type("index + 1.0") == "float"
    assert root_type("index / 2") == "float"  # true division
    assert root_type("index ** 2") == "float"
    assert root_type("min(index, 3)") == "int" and root_type("min(index, x)") == "float"
    assert root_type("where(x > 0, 1, 2)") == "int" and root_type("where(x > 0, 1, x)") == "float"
    assert root_type("int(x) & 7") == "int" and root_type("float(index)") == "float"
    assert root_type("abs(-index)") == "int" and root_type("floor(index)") == "float"


def test_limits_are_errors_not_crashes() -> None:
    deep = "(" * (MAX_DEPTH + 5) + "x" + ")" * (MAX_DEPTH + 5)
    assert "nests deeper" in _error(deep).message
    assert "32 bits" in _error("x + 99999999999").message
    long = "+".join(["x"] * 9000)
    assert "characters" in _error(long).message
    assert "nests deeper" in _error("+".join(["x"] * 2000)).message  # a flat sum nests as deep as it is long
    compile_expression("+".join(["x"] * (MAX_DEPTH - 1)))


def test_caret_points_at_the_column() -> None:
    assert caret("a + * b", 5) == "a + * b\n    ^"
    assert caret("x", None) == "x"


def test_declared_names_take_their_kind_whatever_their_case_and_come_first() -> None:
    from cudapatch.expr.check import declare

    declared = declare(["X", "spare"], ["gain"])
    c = compile_expression("a * X + gain * Bias", declared=declared)
    assert c.inputs == ("X", "spare", "a") and c.scalars == ("gain", "Bias") and c.unused == ("spare",)
    assert compile_expression("a * X + gain * Bias").unused == ()  # nothing declared: the case rule alone
    with pytest.raises(ExpressionError, match="'gain' is declared both an input and a scalar"):
        declare(["gain"], ["gain"])
    with pytest.raises(ExpressionError, match="the name 'Out' is taken by the output port"):
        declare([], ["Out"], reserved={"Out": "the output port"})
    with pytest.raises(ExpressionError, match="'pi' is a built-in name"):
        declare(["pi"], [])
