"""Record parsers: one per data set, a raw record (from the hub or a local file) -> (question text, gold, extra
fields), which :func:`tarpo.tasks.registry.load_task` makes one normalised example.

A record has the hub's fields, Soft-Thinking's ``{"prompt": [{"from", "value"}], "final_answer"}``
form or ARC's AI2 layout. A malformed record raises :class:`DataError` naming the file, row and field.
"""

from __future__ import annotations

import ast
import hashlib
import random

from .answers import last_boxed


class DataError(ValueError):
    """A data file or record that cannot be used; the message names file, row and field."""


class Row:
    """Field access that names the file, row and field on failure."""

    def __init__(self, record: dict, where: str):
        self.record, self.where = record, where

    def get(self, *names, required=True):
        for name in names:
            value = self.record
            for part in name.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if value is not None and value != "":
                return value
        if required:
            raise DataError(f"{self.where}: missing field {' or '.join(repr(n) for n in names)}")
        return None

    def fail(self, name, why):
        raise DataError(f"{self.where}: field {name!r} {why}")


def _soft_thinking_question(row: Row):
    prompt = row.get("prompt", required=False)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) and "value" in prompt[0]:
        return prompt[0]["value"]
    return None


def _number_text(value) -> str:
    """``27.0`` -> ``"27"``; strings pass through stripped."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


# ---- record parsers: raw record -> (question text, gold, extra fields) ----

def parse_gsm8k(row: Row):
    question = _soft_thinking_question(row)
    if question is not None:
        return question, _number_text(row.get("final_answer")), {}
    answer = row.get("answer")
    if "####" not in answer:
        row.fail("answer", "has no '#### <number>' final line")
    return row.get("question"), answer.rsplit("####", 1)[1].strip().replace(",", ""), {}


def parse_math(row: Row):
    question = _soft_thinking_question(row)
    if question is not None:
        return question, _number_text(row.get("final_answer")), {}
    gold = row.get("answer", required=False)
    if gold is None:
        gold = last_boxed(row.get("solution"))
        if gold is None:
            row.fail("solution", "has no \\boxed{} answer")
    meta = {"level": str(row.get("level", required=False) or ""),
            "subject": str(row.get("subject", "type", required=False) or "")}
    return row.get("problem", "question"), _number_text(gold), meta


def parse_olympiad(row: Row):
    final = row.get("final_answer")
    if isinstance(final, str):
        try:
            final = ast.literal_eval(final)
        except (ValueError, SyntaxError):
            row.fail("final_answer", "is not a Python list literal")
    if not isinstance(final, list) or not final:
        row.fail("final_answer", "is not a non-empty list")
    gold = ", ".join(str(a).strip().strip("$") for a in final)
    context = row.get("context", required=False)
    question = row.get("question")
    if context and context != "None":
        question = f"{context}\n\n{question}"
    return question, gold, {"subject": str(row.get("subfield", required=False) or "")}


def parse_dapo(row: Row):
    question = row.get("prompt", "problem")
    if isinstance(question, list):
        question = question[-1].get("content", "") if isinstance(question[-1], dict) else str(question[-1])
    return question, _number_text(row.get("solution", "reward_model.ground_truth", "answer")), {}


LETTERS = "ABCDEFGHIJ"


def _options_question(stem: str, options: list[str]) -> str:
    return stem.strip() + "\n\n" + "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(options))


def parse_arc(row: Row):
    stem = row.get("question.stem", "question")
    if isinstance(stem, dict):
        row.fail("question", "has no 'stem'")
    choices = row.get("question.choices", "choices")
    if isinstance(choices, dict):  # HF layout: {"text": [...], "label": [...]}
        choices = [{"text": t, "label": lab} for t, lab in zip(choices["text"], choices["label"])]
    labels = [str(c.get("label")) for c in choices]
    key = str(row.get("answerKey"))
    if key not in labels:
        row.fail("answerKey", f"{key!r} is not among the labels {labels}")
    gold = LETTERS[labels.index(key)]  # numeric labels 1-5 become letters A-E
    return _options_question(stem, [c["text"] for c in choices]), gold, {"options": LETTERS[:len(choices)]}


def parse_gpqa(row: Row):
    correct = row.get("Correct Answer")
    options = [correct] + [row.get(f"Incorrect Answer {i}") for i in (1, 2, 3)]
    record_id = str(row.get("Record ID", required=False) or row.get("Question"))
    order = list(range(4))
    random.Random(int(hashlib.sha256(record_id.encode()).hexdigest(), 16)).shuffle(order)  # fixed per question
    shuffled = [options[i].strip() for i in order]
    return _options_question(row.get("Question"), shuffled), LETTERS[order.index(0)], {"options": "ABCD"}


def parse_arith(row: Row):
    return row.get("question"), str(row.get("answer")), {"level": str(row.get("level", required=False) or "")}


def parse_humaneval(row: Row):
    prompt = row.get("prompt")
    user = f"Complete the following python function.\n\n```python\n{prompt}```"
    return user, row.get("canonical_solution"), {
        "entry_point": row.get("entry_point"), "test": row.get("test"), "code_prompt": prompt}
