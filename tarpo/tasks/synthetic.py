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
import itertools
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
TWO_STEP_OPERANDS = range(1, 10)


def canonical_form(question: str) -> str:
    """One form for the problems that are one problem: a chain ``a ± b ± c`` (evaluated left to right) is the sum
    of its signed terms, so any order of the same signed terms has the same answer (``3 + 12`` is ``12 + 3``,
    ``7 + 5 - 3`` is ``5 - 3 + 7``); the form is those terms sorted. A question that is not such a chain is
    returned unchanged.

    >>> canonical_form("Compute 12 + 3."), canonical_form("Compute 3 + 12."), canonical_form("Compute 12 - 3.")
    ('+3+12', '+3+12', '-3+12')
    >>> canonical_form("Compute 7 + 5 - 3.") == canonical_form("Compute 5 - 3 + 7.")
    True
    """
    match = re.fullmatch(r"Compute (\d+(?: [+-] \d+)*)\.", question)
    if not match:
        return question
    tokens = match.group(1).split(" ")
    terms = [int(tokens[0])] + [int(v) if op == "+" else -int(v) for op, v in zip(tokens[1::2], tokens[2::2])]
    return "".join(f"{t:+d}" for t in sorted(terms))


def chain_split(split: str, operands, operations: int, prefix: str, shown=()) -> list[dict]:
    """Every chain of ``operations`` additions/subtractions of numbers from ``operands``, each dealt to ``train`` or
    ``test`` by a hash of its :func:`canonical_form`, so the splits never share a problem, not even as reordered
    twins, and are the same on every machine; in a seeded order, ids ``{prefix}-{split}-{i}``. The problems of
    ``shown`` (questions the prompt's worked examples answer) and their twins are left out of ``test``."""
    if split not in SEEDS:
        raise ValueError(f"arith has splits {list(SEEDS)}, not {split!r}")
    shown = {canonical_form(q) for q in shown} if split == "test" else set()
    out = []
    for values in itertools.product(operands, repeat=operations + 1):
        for ops in itertools.product("+-", repeat=operations):
            question = f"Compute {values[0]} " + " ".join(f"{op} {v}" for op, v in zip(ops, values[1:])) + "."
            form = canonical_form(question)
            if ("test" if hashlib.sha256(form.encode()).digest()[0] % 2 else "train") != split or form in shown:
                continue
            total, steps = values[0], []
            for op, v in zip(ops, values[1:]):
                new = total + v if op == "+" else total - v
                steps.append(f"{total}{op}{v}={new}")
                total = new
            out.append({"question": question, "solution": " ".join(steps), "answer": str(total),
                        "level": operations})
    random.Random(SEEDS[split]).shuffle(out)
    return [{**p, "id": f"{prefix}-{split}-{i}"} for i, p in enumerate(out)]


def worked_examples(kind: str) -> list[str]:
    """The questions of the worked examples that ``kind``'s prompt shows (tarpo/resources/prompts.json)."""
    from .chat_messages import system_prompts
    return [question for question, _ in system_prompts()[kind].get("examples", ())]


def one_step_split(split: str) -> list[dict]:
    """The one-operation problems ``a + b`` and ``a - b`` with ``a, b`` in 1..15 (450 in all; :func:`chain_split`,
    ids ``arith1-...``). The real-model learning check's task (``arith_one``, docs/real-model.md).

    >>> [len(one_step_split(s)) for s in ("train", "test")]
    [228, 220]
    >>> train = {canonical_form(p["question"]) for p in one_step_split("train")}
    >>> any(canonical_form(p["question"]) in train for p in one_step_split("test"))
    False
    """
    return chain_split(split, ONE_STEP_OPERANDS, 1, "arith1", worked_examples("arith_one"))


def two_step_split(split: str) -> list[dict]:
    """The two-operation problems ``a ± b ± c`` with ``a, b, c`` in 1..9 (2,916 in all; :func:`chain_split`, ids
    ``arith2-...``): the real-model tables' column where a step of reasoning matters (``arith_two``,
    docs/paper-mini.md).

    >>> [len(two_step_split(s)) for s in ("train", "test")]
    [1515, 1393]
    >>> two_step_split("test")[0]["solution"].count("=")
    2
    """
    return chain_split(split, TWO_STEP_OPERANDS, 2, "arith2", worked_examples("arith_two"))


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
