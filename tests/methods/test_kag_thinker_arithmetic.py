"""KAG-Thinker's safe Math evaluator (:mod:`tcrag_langgraph.methods.kag_thinker.arithmetic`):
whitelisted arithmetic only, bounded in size."""

from __future__ import annotations

import pytest

from tcrag_langgraph.methods.kag_thinker import ArithmeticRefused, evaluate_arithmetic


def test_arithmetic_evaluates_whitelisted_expressions():
    assert evaluate_arithmetic("210.4 + 569.2 + 1,035.2 + 2044.5 + 1035") == pytest.approx(4894.3)
    assert evaluate_arithmetic("-(2 ** 10) // 3 % 7") == (-(2 ** 10) // 3) % 7
    assert evaluate_arithmetic("max(1,200) + min(3, 4) + abs(-2) + round(2.6) + sqrt(16)") == 200 + 3 + 2 + 3 + 4


@pytest.mark.parametrize("text", [
    "__import__('os')", "__import__('os').system('true')", "().__class__", "open('/etc/passwd')",
    "x + 1", "'a' * 3", "[1, 2]", "lambda: 1", "2 ** 10000", "9 ** 9 ** 9", "10.0 ** 200", "1 / 0",
    "True + 1", "max(1, key=abs)", "", "1 +", "sqrt(-1)", "x" * 600,
])
def test_arithmetic_refuses_everything_else(text):
    with pytest.raises(ArithmeticRefused):
        evaluate_arithmetic(text)
