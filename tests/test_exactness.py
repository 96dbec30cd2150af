"""Every exact float comparison in the tests says why it is exact.

The rule: assert exact float equality only where the same kernels run on the same shapes with the same inputs
(the same function twice on the same tensors, a save/load round trip, a resume that replays the same ops,
integers and booleans, values exact by construction such as masked zeros). Where two computations are only
mathematically equal (other shapes, batch sizes, chunking or code paths, eager against compiled, an adapter with
B = 0 against the adapter disabled, one process against several with a reduction, another grouping of a sum),
compare with a tolerance. Intel MKL's AVX-512 sgemm, for one, rounds such pairs an ulp apart where AMD CPUs do not.

A site is a line of tests/*.py or tests/workers/*.py that matches one of PATTERNS:

    torch.equal(          tensors equal to the bit
    array_equal(          numpy's array_equal and assert_array_equal
    atol=0, atol=0.0      a zero absolute tolerance (assert_close(..., rtol=0, atol=0))
    == 0.0                a value compared with a float zero
    x[...] == 0           a subscripted value (a logged metric, a tensor element) compared with zero
    .max() == 0           a reduction (max, min, sum, norm, item) compared with zero
    (a == b).all()        an elementwise comparison that must hold everywhere

Each site says why, on its line or the line just above: ``# exact: <why exact equality holds>`` or
``# tolerance: <the reason, and why this tolerance>``. A line pattern cannot tell dtypes apart, so integer and
boolean sites say so too (``# exact: integer ids``). Comment lines are not sites. Comparisons the patterns do not
see (``a == b`` on records or metrics dicts) follow the same rule by review.
"""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERNS = [
    r"torch\.equal\(",
    r"array_equal\(",
    r"\batol=0(?:\.0*)?(?![\d.eE])",
    r"==\s*-?0\.0+\b(?!\.)",
    r"(?<!% )\b\w+(?:\[[^\]]*\])+\s*==\s*0(?![\d.])",
    r"\.(?:max|min|sum|norm|item)\(\)\s*==\s*0(?![\d.])",
    r"\([^()]*==[^()]*\)\.all\(\)",
]
SITE = re.compile("|".join(PATTERNS))
REASONS = ("# exact:", "# tolerance:")


def unexplained(text: str) -> list[int]:
    """Line numbers (1-based) of the sites in ``text`` with no reason on their line or the line above."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#") or not SITE.search(line):
            continue
        if not any(r in near for near in (line, lines[i - 1] if i else "") for r in REASONS):
            found.append(i + 1)
    return found


def test_every_exact_float_assertion_says_why():
    me = os.path.relpath(os.path.abspath(__file__), ROOT)
    files = sorted(glob.glob(os.path.join(ROOT, "tests", "*.py")) + glob.glob(os.path.join(ROOT, "tests", "workers",
                                                                                         "*.py")))
    missing = []
    for path in files:
        rel = os.path.relpath(path, ROOT)
        if rel == me:
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines = text.splitlines()
        missing += [f"{rel}:{n}: {lines[n - 1].strip()}" for n in unexplained(text)]
    assert not missing, ("exact comparisons with no '# exact:' or '# tolerance:' reason (tests/test_exactness.py):\n"
                         + "\n".join(missing))


def test_the_scanner_flags_an_unexplained_site_and_accepts_an_explained_one():
    flagged = [
        "assert torch.equal(a, b)",
        "assert np.array_equal(a, b)",
        "torch.testing.assert_close(a, b, rtol=0, atol=0)",
        "torch.testing.assert_close(a, b, atol=0.0, rtol=0)",
        "assert loss.item() == 0.0",
        'assert got["rel_err"] == 0 and g[0, 2] == 0',
        "assert diff.abs().max() == 0",
        "assert (a == b).all()",
    ]
    for line in flagged:
        assert unexplained(f"x = 1\n{line}\n") == [2], line
        assert unexplained(f"{line}  # exact: the same function on the same tensors\n") == [], line
        assert unexplained(f"# tolerance: fp32 rounding of another grouping\n{line}\n") == [], line
        assert unexplained(f"# exact: two lines up does not count\nx = 1\n{line}\n") == [3], line
    not_sites = [
        "torch.testing.assert_close(a, b, atol=1e-6, rtol=0)",
        "torch.testing.assert_close(a, b, atol=0.01, rtol=0)",
        "assert res.returncode == 0",
        "assert batch % plan[\"micro_batch\"] == 0",
        "assert x == 0.05",
        "# assert torch.equal(a, b): a comment line",
    ]
    for line in not_sites:
        assert unexplained(line + "\n") == [], line
