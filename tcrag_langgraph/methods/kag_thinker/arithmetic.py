"""Safe arithmetic for the Math function: :func:`evaluate_arithmetic` walks the syntax tree over a
whitelist of node types (never ``eval``), bounded in size; plus the number helpers Math uses."""

from __future__ import annotations

import ast
import math
import operator
import re
from typing import Any, Callable, Optional


class ArithmeticRefused(ValueError):
    """The text is not a plain arithmetic expression (or its value is out of bounds)."""


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"abs": abs, "min": min, "max": max, "round": round,
                                               "sqrt": math.sqrt}
_MAX_EXPRESSION_CHARS = 500
_MAX_EXPONENT = 64
_MAX_MAGNITUDE = 1e100


def evaluate_arithmetic(expression: str) -> float | int:
    """The value of a plain arithmetic expression, computed by walking its syntax tree.

    Allowed: numbers, ``+ - * / // % **``, unary ``+ -``, parentheses, and the functions
    ``abs min max round sqrt`` with positional arguments. Anything else (names, attributes,
    strings, subscripts, lambdas, ``__import__('os')``...) raises :class:`ArithmeticRefused`, as do
    exponents above 64 in size and values above 1e100 (so no expression can exhaust the machine).
    Commas between digit groups (``1,035.2``) are read as thousands separators.

    Example:
        >>> evaluate_arithmetic("210.4 + 569.2 + 1,035.2 + 2044.5 + 1035")
        4894.3
        >>> evaluate_arithmetic("__import__('os')")
        Traceback (most recent call last):
        ...
        tcrag_langgraph.methods.kag_thinker.arithmetic.ArithmeticRefused: calls allowed only to abs, max, min, round, sqrt
    """
    if not isinstance(expression, str):
        raise ArithmeticRefused(f"the expression must be text, not {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("÷", "/")
    if "(" not in text or not re.search(r"[A-Za-z_]\s*\(", text):  # in a call, max(1,200) has two arguments
        text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    if not text:
        raise ArithmeticRefused("the expression is empty")
    if len(text) > _MAX_EXPRESSION_CHARS:
        raise ArithmeticRefused(f"the expression is longer than {_MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as err:
        raise ArithmeticRefused(f"not an arithmetic expression: {err.msg if isinstance(err, SyntaxError) else err}") from None
    value = _walk(tree.body)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return round(value, 10)
    return round(value, 10) if isinstance(value, float) else value


def _walk(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ArithmeticRefused(f"only numbers are allowed, not {node.value!r}")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_walk(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ArithmeticRefused(f"exponents above {_MAX_EXPONENT} are not computed")
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ArithmeticRefused("division by zero") from None
        except (OverflowError, ValueError, TypeError) as err:
            raise ArithmeticRefused(f"cannot compute: {err}") from None
    if isinstance(node, ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS) or node.keywords:
            raise ArithmeticRefused(f"calls allowed only to {', '.join(sorted(_FUNCTIONS))}")
        args = [_walk(a) for a in node.args]
        try:
            return _bounded(_FUNCTIONS[node.func.id](*args))
        except (TypeError, ValueError) as err:
            raise ArithmeticRefused(f"cannot compute {node.func.id}: {err}") from None
    raise ArithmeticRefused(f"{type(node).__name__} is not allowed in an arithmetic expression")


def _bounded(value: Any) -> float | int:
    if isinstance(value, complex) or not isinstance(value, (int, float)):
        raise ArithmeticRefused("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value) or abs(value) > _MAX_MAGNITUDE:
        raise ArithmeticRefused(f"the value is out of range (above {_MAX_MAGNITUDE:g})")
    return value


def _expression_side(text: str) -> str:
    """In ``total = 3 + 4`` the right side, in ``3 + 4 = 7`` the left: the side that computes."""
    if text.count("=") != 1:
        return text
    left, right = (part.strip() for part in text.split("="))
    if re.fullmatch(r"[A-Za-z_ ]+", left) or not left:
        return right
    return left


def _format_number(value: float | int) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def _first_number(text: str) -> Optional[str]:
    found = _NUMBER.search(text or "")
    return found.group(0).replace(",", "") if found else None
