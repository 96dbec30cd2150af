"""A synthetic reasoning task for the CPU testbed: multi-step integer arithmetic.

A level-L problem chains L additions/subtractions of one-digit numbers, evaluated left
to right; its worked solution writes one step per operation, then the answer tag::

    Compute 7 + 5 - 3.          ->  7+5=12 12-3=9 #### 9

Problems come from a seeded generator; ``train`` and ``test`` use different seeds and the
test split drops any question that also occurs in the train split. The task is registered
as ``arith`` and graded like GSM8K (exact number after the tag).

    >>> problem(random.Random(0), 2)
    {'question': 'Compute 7 - 7 - 1.', 'solution': '7-7=0 0-1=-1', 'answer': '-1', 'level': 2}
"""

from __future__ import annotations

import hashlib
import random
import re

LEVELS = (1, 2, 3)
SIZES = {"train": 4000, "test": 300}
SEEDS = {"train": 1234, "test": 98765}
_STEP = re.compile(r"(-?\d+)([+-])(\d+)=-?\d+")


def problem(rng: random.Random, level: int) -> dict:
    values = [rng.randint(1, 9) for _ in range(level + 1)]
    ops = [rng.choice("+-") for _ in range(level)]
    total, steps = values[0], []
    for op, v in zip(ops, values[1:]):
        new = total + v if op == "+" else total - v
        steps.append(f"{total}{op}{v}={new}")
        total = new
    text = " ".join(f"{op} {v}" for op, v in zip(ops, values[1:]))
    return {"question": f"Compute {values[0]} {text}.", "solution": " ".join(steps), "answer": str(total),
            "level": level}


def make_split(split: str, n: int | None = None, levels=LEVELS) -> list[dict]:
    """``n`` problems (default ``SIZES[split]``), levels drawn uniformly, ids ``arith-{split}-{i}``."""
    if split not in SEEDS:
        raise ValueError(f"arith has splits {list(SEEDS)}, not {split!r}")
    rng = random.Random(SEEDS[split])
    exclude = {p["question"] for p in make_split("train")} if split == "test" else set()
    out = []
    while len(out) < (n or SIZES[split]):
        p = problem(rng, rng.choice(levels))
        if p["question"] not in exclude:
            out.append({**p, "id": f"arith-{split}-{len(out)}"})
    return out


ONE_STEP_OPERANDS = range(1, 16)


def one_step_split(split: str) -> list[dict]:
    """The one-operation problems ``a + b`` and ``a - b`` with ``a, b`` in 1..15 (450 in all), each dealt to
    ``train`` or ``test`` by a hash of its question, so the two splits never share a question and are the same
    on every machine (222 train, 228 test); in a seeded order, ids ``arith1-{split}-{i}``. The real-model
    learning check's task (``arith_one``, docs/real-model.md).

    >>> [len(one_step_split(s)) for s in ("train", "test")]
    [222, 228]
    >>> one_step_split("test")[0]["question"] in {p["question"] for p in one_step_split("train")}
    False
    """
    if split not in SEEDS:
        raise ValueError(f"arith has splits {list(SEEDS)}, not {split!r}")
    out = []
    for a in ONE_STEP_OPERANDS:
        for op in "+-":
            for b in ONE_STEP_OPERANDS:
                question = f"Compute {a} {op} {b}."
                if ("test" if hashlib.sha256(question.encode()).digest()[0] % 2 else "train") == split:
                    total = a + b if op == "+" else a - b
                    out.append({"question": question, "solution": f"{a}{op}{b}={total}", "answer": str(total),
                                "level": 1})
    random.Random(SEEDS[split]).shuffle(out)
    return [{**p, "id": f"arith1-{split}-{i}"} for i, p in enumerate(out)]


def completion_text(record: dict, tag: str = "####") -> str:
    """The worked solution in the answer format of the math prompt."""
    return f"{record['solution']} {tag} {record['answer']}"


def noisy_demonstration(record: dict, rng: random.Random, p: float, tag: str = "####") -> str:
    """A worked solution in which each step's result is off by one with probability ``p``;
    later steps (and the answer) continue from the wrong value, as a careless solver would.

    >>> noisy_demonstration(problem(random.Random(0), 2), random.Random(3), p=1.0)
    '7-7=-1 -1-1=-1 #### -1'
    """
    steps, total = [], None
    for step in record["solution"].split(" "):
        a, op, b = _STEP.match(step).groups()
        a = int(a) if total is None else total
        total = a + int(b) if op == "+" else a - int(b)
        if rng.random() < p:
            total += rng.choice((-1, 1))
        steps.append(f"{a}{op}{b}={total}")
    return f"{' '.join(steps)} {tag} {total}"
