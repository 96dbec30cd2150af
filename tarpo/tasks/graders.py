"""Graders: one registry used by the trainer's reward and by evaluation.

Every grader scores ``(completion, example) -> float`` in {0, 1}. Two modes:

- **score** (evaluation): is the extracted answer correct? The answer is the text after
  the last answer tag, falling back (configurable) to the last ``\\boxed{}`` and then
  the last number; for code, the last fenced python block.
- **reward** (training, docs/algorithm.md §6): 1 only if the answer tag appears exactly once *and*
  the answer after it is correct (code: exactly one "```python" fence and the tests pass).

Registry (``GRADERS``): ``math_verify`` (math-verify, gold first, in worker processes with
a wall-clock timeout), ``math_reference`` (Hendrycks-style string normalisation),
``gsm8k`` (exact numeric comparison), ``multiple_choice`` (exactly one option letter),
``humaneval`` (unit tests in the sandbox of :mod:`tarpo.tasks.sandbox`).
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version

from . import math_grading, sandbox
from .answers import FALLBACKS, extract_answer, extract_code
from .chat_messages import answer_tag
from .registry import get_task
from .workers import shared_pool

DEFAULT_TIMEOUT = 10.0  # seconds per math answer / per HumanEval program
# The training reward's math timeout: an answer built to stall math-verify (a tower of powers,
# 100000!) costs ~5 s per sample; in RL a policy that found such answers would stall every step.
# They score 0 and are counted (``timeouts`` of the reward function, logged per step).
REWARD_MATH_TIMEOUT = 2.0
DEFAULT_WORKERS = 2


@dataclass(frozen=True)
class Grade:
    score: float
    answer: str | None
    timed_out: bool = False
    error: str | None = None


def grader_versions(name: str) -> dict:
    """Provenance for results files: grader name and the versions it depends on."""
    info = {"grader": name, "tarpo": version("tarpo")}
    if name == "math_verify":
        info["math_verify"] = version("math-verify")
    if name == "humaneval":
        info["sandbox_isolation"] = sandbox.isolation()
    return info


def multiple_choice_letter(answer: str, options: str = "ABCD") -> str | None:
    """The single option letter an answer names, or None if it names none or several
    (a capital letter standing alone, outside a word, counts as naming it).

    >>> [multiple_choice_letter(a) for a in ["C", "(B).", "\\\\boxed{D}", "A or B", "The answer is C", "E"]]
    ['C', 'B', 'D', None, 'C', None]
    """
    text = re.sub(r"\\(?:boxed|text|textbf|mathrm)\{([^{}]*)\}", r"\1", answer)
    found = {m for m in re.findall(r"(?<![A-Za-z])([A-Z])(?![A-Za-z])", text) if m in options}
    return found.pop() if len(found) == 1 else None


def _inline(check):
    def run(answers, examples, workers, timeout):
        return [Grade(float(a is not None and check(ex, a)), a) for a, ex in zip(answers, examples)]
    return run


def _pooled(fn):
    def run(answers, examples, workers, timeout):
        todo = [i for i, a in enumerate(answers) if a]
        results = shared_pool(workers, timeout).map(fn, [(examples[i]["gold"], answers[i]) for i in todo])
        grades = [Grade(0.0, a) for a in answers]
        for i, r in zip(todo, results):
            grades[i] = Grade(float(bool(r.value)), answers[i], r.timed_out, r.error)
        return grades
    return run


def _humaneval(codes, examples, workers, timeout):
    def one(code, ex):
        if not code:
            return Grade(0.0, code)
        # A pass needs the tests' own completion token, not just exit status 0 (docs/humaneval-sandbox.md).
        result = sandbox.run_humaneval(ex["code_prompt"], code, ex["test"], ex["entry_point"], timeout=timeout)
        return Grade(float(result.passed), code, result.status == "timeout",
                     None if result.status in ("passed", "failed", "timeout") else result.stderr[-300:])
    with ThreadPoolExecutor(max(1, workers)) as ex:
        return list(ex.map(one, codes, examples))


GRADERS = {
    "math_verify": _pooled(math_grading.verify_math),
    "math_reference": _inline(lambda ex, a: math_grading.reference_equal(ex["gold"], a)),
    "gsm8k": _inline(lambda ex, a: math_grading.gsm8k_equal(ex["gold"], a)),
    "multiple_choice": _inline(lambda ex, a: multiple_choice_letter(a, ex.get("options") or "ABCD") == ex["gold"]),
    "humaneval": _humaneval,
}


def grade_batch(completions: list[str], examples: list[dict], grader: str | None = None, *, reward: bool = False,
                fallbacks=FALLBACKS, workers: int = DEFAULT_WORKERS, timeout: float = DEFAULT_TIMEOUT) -> list[Grade]:
    """Grade completions against their examples (each a task example with ``task`` and ``gold``)."""
    if len(completions) != len(examples):
        raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
    if not completions:
        return []
    task = get_task(examples[0]["task"])
    grader = grader or task.grader
    if grader not in GRADERS:
        raise ValueError(f"unknown grader {grader!r}; known: {', '.join(GRADERS)}")
    tag = answer_tag(task.kind)
    answers, well_formed = [], []
    for text in completions:
        if task.kind == "code":
            answers.append(extract_code(text))
            well_formed.append(text.count(tag) == 1)
        else:
            found = extract_answer(text, tag, () if reward else fallbacks)
            answers.append(found.answer)
            well_formed.append(found.tag_count == 1)
    if reward:  # the format rule: an answer that breaks it is not graded at all
        answers = [a if ok else None for a, ok in zip(answers, well_formed)]
    return GRADERS[grader](answers, examples, workers, timeout)


def canonical_answers(answers: list[str | None], task: str, workers: int = DEFAULT_WORKERS,
                      timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """Strings under which equivalent answers coincide, for majority voting ("" = no answer)."""
    kind = get_task(task).grader
    if kind == "multiple_choice":
        return [multiple_choice_letter(a) or "" if a else "" for a in answers]
    if kind == "gsm8k":
        return [str(math_grading.gsm8k_number(a) or "") if a else "" for a in answers]
    if kind == "humaneval":
        return [a or "" for a in answers]
    results = shared_pool(workers, timeout).map(math_grading.canonical_math, [(a or "",) for a in answers])
    return [r.value if r.value is not None else "" for r in results]


def reward_function(task: str, grader: str | None = None, workers: int = DEFAULT_WORKERS,
                    timeout: float | None = None):
    """A TRL reward function: ``f(prompts, completions, **columns) -> list[float]``.

    It reads the example fields (``gold``, ``task``, and HumanEval's ``entry_point``, ``test``,
    ``code_prompt``) from the data set's columns, which TRL passes through. ``timeout``: seconds
    per answer, by default :data:`REWARD_MATH_TIMEOUT` for math-verify and
    :data:`DEFAULT_TIMEOUT` otherwise; the function's ``timeouts`` attribute holds how many
    answers of its last call timed out (scored 0).
    """
    if timeout is None:
        timeout = REWARD_MATH_TIMEOUT if (grader or get_task(task).grader) == "math_verify" else DEFAULT_TIMEOUT

    def correct(prompts, completions, **columns):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        keys = [k for k in ("gold", "task", "options", "entry_point", "test", "code_prompt") if k in columns]
        examples = [{k: columns[k][i] for k in keys} for i in range(len(texts))]
        for ex in examples:
            ex.setdefault("task", task)
        grades = grade_batch(texts, examples, grader, reward=True, workers=workers, timeout=timeout)
        correct.timeouts = sum(g.timed_out for g in grades)
        return [g.score for g in grades]
    correct.__name__ = f"correct_{task}"
    correct.timeouts = 0
    return correct
