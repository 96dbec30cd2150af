"""Math answer checks. The math-verify functions here run inside :mod:`tarpo.tasks.workers`
processes (never call them on an untrusted answer in the trainer's process).

- :func:`verify_math` — math-verify, gold first: ``verify(parse(\\boxed{gold}), parse(answer))``.
- :func:`canonical_math` — a string under which equivalent answers coincide (majority voting).
- :func:`reference_equal` — the published code's style of check: Hendrycks-MATH string
  normalisation on both sides, then string equality. Cheap and deterministic; use it to
  compare numbers with papers that graded this way.
- :func:`gsm8k_equal` — numeric comparison after removing separators, units and trailing zeros.
"""

from __future__ import annotations

import re
from fractions import Fraction

from math_verify import parse, verify

MAX_ANSWER_CHARS = 10_000  # longer answers are wrong by definition (and not parsed)


_MATH_DELIMITER = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed")


def _parse_answer(answer: str):
    """A bare answer is read as the content of a \\boxed{}; one with its own $...$, \\(...\\) or
    \\boxed is parsed as written."""
    if _MATH_DELIMITER.search(answer):
        return parse(answer)
    return parse("\\boxed{" + answer + "}") or parse(answer)


def verify_math(gold: str, answer: str) -> bool:
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return False
    target = parse("\\boxed{" + gold + "}")
    return bool(target) and verify(target, _parse_answer(answer))


def canonical_math(answer: str) -> str:
    """Equivalent answers map to one string: ``1/2``, ``0.5`` and ``\\frac{1}{2}`` give ``1/2``.

    Numbers become exact rationals; other expressions their simplified sympy form; an
    answer math-verify cannot parse keeps its whitespace-normalised text.
    """
    import sympy

    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return ""
    parsed = _parse_answer(answer)
    if not parsed:
        return " ".join(answer.split())
    expr = parsed[0]
    if isinstance(expr, sympy.Basic):
        if expr.is_Number:
            expr = sympy.nsimplify(expr, rational=True)
        else:
            expr = sympy.simplify(expr)
    return str(expr)


# ---- Hendrycks-style string normalisation (written from the MATH paper's description) ----

_UNIT_WORDS = r"(?:units?|cm|m|km|inches|inch|feet|ft|degrees?|dollars?|cents?|meters?|sq|square)"


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{b}`` -> ``\\frac{1}{b}``."""
    return re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s))


def normalize_math_string(s: str) -> str:
    """Normalise a final answer string for exact comparison.

    >>> normalize_math_string("\\\\dfrac{1}{2}") == normalize_math_string("1/2") == normalize_math_string("0.5")
    True
    >>> normalize_math_string("\\\\text{(C)}"), normalize_math_string("x = 5"), normalize_math_string("90^\\\\circ")
    ('C', '5', '90')
    """
    s = s.strip().replace("\n", "").replace("\\!", "")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\%", "").replace("%", "").replace("\\$", "")
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\mbox\{\s*([^{}]*)\}", r"\1", s)
    s = re.sub(rf"\s*{_UNIT_WORDS}(\^?\d)?\s*$", "", s)
    s = s.rstrip(".").strip()
    if re.fullmatch(r"[a-zA-Z]\s*=\s*.+", s):  # "x = 5" -> "5"
        s = s.split("=", 1)[1]
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^\(([A-Z])\)$", r"\1", s)
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = _fix_fracs(s)
    s = re.sub(r"^(-?\d+)/(\d+)$", r"\\frac{\1}{\2}", s)
    if s.startswith("."):
        s = "0" + s
    if re.fullmatch(r"-?\d+\.\d+", s) or re.fullmatch(r"-?\d+", s):
        value = Fraction(s)
        s = str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
        if s.startswith("\\frac{-"):
            s = "-\\frac{" + s[7:]
    return s


def reference_equal(gold: str, answer: str) -> bool:
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return False
    return normalize_math_string(gold) == normalize_math_string(answer)


_PLAIN_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def gsm8k_number(text: str) -> Fraction | None:
    """The first number of an answer as an exact fraction: ``$1,200.50`` -> 2401/2.

    >>> gsm8k_number("$1,200.50 per week"), gsm8k_number("3/4"), gsm8k_number("no number")
    (Fraction(2401, 2), Fraction(3, 4), None)
    """
    m = _PLAIN_NUMBER.search(text[:MAX_ANSWER_CHARS].replace("−", "-"))
    if not m or len(m.group()) > 64:
        return None
    num, _, den = m.group().replace(",", "").partition("/")
    try:
        value = Fraction(num)
        return value / Fraction(den) if den else value
    except (ValueError, ZeroDivisionError):
        return None


def gsm8k_equal(gold: str, answer: str) -> bool:
    want, got = gsm8k_number(gold), gsm8k_number(answer or "")
    return want is not None and got is not None and want == got
