"""The task registry: every data set of the paper, loaded from the hub or a local file.

A task knows its hub id/config/split, its prompt kind (``math``, ``multiple_choice`` or
``code``, docs/algorithm.md §6), its default grader and its evaluation lengths (docs/algorithm.md §5). Each
raw record becomes one normalised example::

    {"id": str, "prompt": [system message, user message], "gold": str,
     "level": str, "subject": str, "task": name, **task fields}

(HumanEval adds ``entry_point``, ``test`` and ``code_prompt``). Local files are JSONL with
the hub's fields, Soft-Thinking's ``{"prompt": [{"from", "value"}], "final_answer"}``
form, ARC's AI2 layout, or the Hendrycks MATH folder layout ``{split}/{subject}/*.json``.
A malformed record raises :class:`DataError` naming the file, row and field.

    >>> TASKS["gsm8k"].hub_id, TASKS["gsm8k"].eval_lengths
    ('openai/gsm8k', (512, 512))
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Callable

import datasets

from . import synthetic
from .answers import last_boxed


class DataError(ValueError):
    """A data file or record that cannot be used; the message names file, row and field."""


@cache
def system_prompts() -> dict:
    return json.loads(resources.files("tarpo").joinpath("resources/prompts.json").read_text())


def messages(kind: str, user: str) -> list[dict]:
    """The chat prompt of a question: the kind's system prompt, its worked examples as earlier turns (a kind with
    ``examples``: [question, answer] pairs), then the question.

    >>> [m["role"] for m in messages("arith_shots", "Compute 1 + 2.")]
    ['system', 'user', 'assistant', 'user', 'assistant', 'user']
    """
    prompt = system_prompts()[kind]
    shots = [{"role": role, "content": text} for pair in prompt.get("examples", ())
             for role, text in zip(("user", "assistant"), pair)]
    return [{"role": "system", "content": prompt["system"]}, *shots, {"role": "user", "content": user}]


def answer_tag(kind: str) -> str:
    return system_prompts()[kind]["answer_tag"]


class _Row:
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


def _soft_thinking_question(row: _Row):
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

def parse_gsm8k(row: _Row):
    question = _soft_thinking_question(row)
    if question is not None:
        return question, _number_text(row.get("final_answer")), {}
    answer = row.get("answer")
    if "####" not in answer:
        row.fail("answer", "has no '#### <number>' final line")
    return row.get("question"), answer.rsplit("####", 1)[1].strip().replace(",", ""), {}


def parse_math(row: _Row):
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


def parse_olympiad(row: _Row):
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


def parse_dapo(row: _Row):
    question = row.get("prompt", "problem")
    if isinstance(question, list):
        question = question[-1].get("content", "") if isinstance(question[-1], dict) else str(question[-1])
    return question, _number_text(row.get("solution", "reward_model.ground_truth", "answer")), {}


LETTERS = "ABCDEFGHIJ"


def _options_question(stem: str, options: list[str]) -> str:
    return stem.strip() + "\n\n" + "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(options))


def parse_arc(row: _Row):
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


def parse_gpqa(row: _Row):
    correct = row.get("Correct Answer")
    options = [correct] + [row.get(f"Incorrect Answer {i}") for i in (1, 2, 3)]
    record_id = str(row.get("Record ID", required=False) or row.get("Question"))
    order = list(range(4))
    random.Random(int(hashlib.sha256(record_id.encode()).hexdigest(), 16)).shuffle(order)  # fixed per question
    shuffled = [options[i].strip() for i in order]
    return _options_question(row.get("Question"), shuffled), LETTERS[order.index(0)], {"options": "ABCD"}


def parse_arith(row: _Row):
    return row.get("question"), str(row.get("answer")), {"level": str(row.get("level", required=False) or "")}


def parse_humaneval(row: _Row):
    prompt = row.get("prompt")
    user = f"Complete the following python function.\n\n```python\n{prompt}```"
    return user, row.get("canonical_solution"), {
        "entry_point": row.get("entry_point"), "test": row.get("test"), "code_prompt": prompt}


@dataclass(frozen=True)
class Task:
    name: str
    kind: str                                # prompt kind: math | multiple_choice | code | arith
    parse: Callable
    grader: str
    hub_id: str
    hub_config: str | None = None
    split: str = "test"
    eval_lengths: tuple[int, int] = (512, 1024)   # max prompt / new tokens at test time (docs/algorithm.md §5)
    id_fields: tuple[str, ...] = ("unique_id", "id", "task_id")
    generate: Callable | None = None             # split -> records, for synthetic tasks (no hub)
    local_split: str | None = None               # split name of local files if not `split` (eval-only sets)


TASKS: dict[str, Task] = {t.name: t for t in [
    Task("gsm8k", "math", parse_gsm8k, "gsm8k", "openai/gsm8k", "main", eval_lengths=(512, 512)),
    Task("math", "math", parse_math, "math_verify", "EleutherAI/hendrycks_math", None),
    Task("math500", "math", parse_math, "math_verify", "HuggingFaceH4/MATH-500"),
    Task("amc23", "math", parse_math, "math_verify", "math-ai/amc23", eval_lengths=(2048, 2048)),
    Task("aime24", "math", parse_math, "math_verify", "HuggingFaceH4/aime_2024", split="train",
         eval_lengths=(2048, 2048), local_split="test"),
    Task("aime25", "math", parse_math, "math_verify", "math-ai/aime25", eval_lengths=(2048, 2048)),
    Task("olympiadbench", "math", parse_olympiad, "math_verify", "Hothan/OlympiadBench", "OE_TO_maths_en_COMP",
         split="train", eval_lengths=(4096, 4096), local_split="test"),
    Task("dapo", "math", parse_dapo, "math_verify", "open-r1/DAPO-Math-17k-Processed", "en", split="train",
         eval_lengths=(1024, 2048)),
    Task("gpqa_diamond", "multiple_choice", parse_gpqa, "multiple_choice", "Idavidrein/gpqa", "gpqa_diamond",
         split="train", eval_lengths=(1024, 1024), local_split="test"),
    Task("arc_challenge", "multiple_choice", parse_arc, "multiple_choice", "allenai/ai2_arc", "ARC-Challenge",
         eval_lengths=(1024, 1024)),
    Task("humaneval", "code", parse_humaneval, "humaneval", "openai/openai_humaneval",
         eval_lengths=(2048, 2048)),
    # The CPU testbed's synthetic arithmetic (tarpo.tasks.synthetic); generated, never downloaded.
    Task("arith", "arith", parse_arith, "gsm8k", "", eval_lengths=(256, 64), generate=synthetic.make_split),
    # the same problems, the answer format shown by two worked examples as earlier chat turns: how a small real
    # model (SmolLM2-135M-Instruct) starts writing the #### tag the reward reads (docs/real-model.md)
    Task("arith_shots", "arith_shots", parse_arith, "gsm8k", "", eval_lengths=(256, 64),
         generate=synthetic.make_split),
    # one-operation problems (a ± b, a and b in 1..15), a one-line system prompt and two one-operation worked
    # examples as earlier chat turns, train and test split by a hash of the question: the real-model learning
    # check's task (docs/real-model.md)
    Task("arith_one", "arith_one", parse_arith, "gsm8k", "", eval_lengths=(256, 64),
         generate=synthetic.one_step_split),
]}
# The MATH hub copy is split by subject; its configs are concatenated alphabetically.
MATH_SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                 "prealgebra", "precalculus")


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[name]


def _read_local(path: str, split: str) -> list[tuple[str, dict]]:
    """(where, record) pairs from a JSONL/JSON file or a folder (``{split}.jsonl`` or MATH layout)."""
    if os.path.isdir(path):
        jsonl = os.path.join(path, f"{split}.jsonl")
        if os.path.isfile(jsonl):
            return _read_local(jsonl, split)
        subject_root = os.path.join(path, split)
        if not os.path.isdir(subject_root):
            raise DataError(f"{path}: neither {split}.jsonl nor a {split}/<subject>/*.json folder")
        out = []
        for subject in sorted(os.listdir(subject_root)):
            for name in sorted(os.listdir(os.path.join(subject_root, subject))):
                file = os.path.join(subject_root, subject, name)
                if name.endswith(".json"):
                    record = _load_json(file, file)
                    record.setdefault("unique_id", f"{split}/{subject}/{name}")
                    out.append((file, record))
        return out
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file or folder")
    if path.endswith(".json"):
        data = _load_json(path, path)
        if not isinstance(data, list):
            raise DataError(f"{path}: a .json data file must hold a list of records")
        return [(f"{path}: row {i + 1}", r) for i, r in enumerate(data)]
    out = []
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            line = _utf8(raw, f"{path}: row {i + 1}")
            if line.strip():
                out.append((f"{path}: row {i + 1}", _load_json_line(line, f"{path}: row {i + 1}")))
    return out


def _utf8(raw: bytes, where: str) -> str:
    """``raw`` decoded, or a :class:`DataError` naming ``where`` and the offending byte.

    >>> _utf8(b"ok", "f: row 1")
    'ok'
    >>> _utf8(b'{"q": "caf\\xe9"}', "f: row 2")
    Traceback (most recent call last):
    ...
    tarpo.tasks.registry.DataError: f: row 2: not UTF-8 (byte 0xe9 at column 11)
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start)
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        at = f"line {line + 1}, column {col}" if line else f"column {col}"
        raise DataError(f"{where}: not UTF-8 (byte 0x{raw[exc.start]:02x} at {at})") from None


def _load_json(file: str, where: str):
    with open(file, "rb") as f:
        return _load_json_line(_utf8(f.read(), where), where)


def _load_json_line(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None


def _read_hub(task: Task, split: str) -> list[tuple[str, dict]]:
    if task.generate is not None:
        return [(f"{task.name}[{split}]: row {i + 1}", r) for i, r in enumerate(task.generate(split))]
    if task.name == "math":
        parts = [datasets.load_dataset(task.hub_id, s, split=split) for s in MATH_SUBJECTS]
        rows = [r for part in parts for r in part]
    else:
        rows = list(datasets.load_dataset(task.hub_id, task.hub_config, split=split))
    return [(f"{task.hub_id}[{split}]: row {i + 1}", r) for i, r in enumerate(rows)]


def load_task(name: str, path: str | None = None, split: str | None = None, limit: int | None = None,
              ) -> datasets.Dataset:
    """Normalised examples of a task, from ``path`` (file or folder) or the hub."""
    task = get_task(name)
    split = split or (task.local_split if path and task.local_split else task.split)
    raw = _read_local(path, split) if path else _read_hub(task, split)
    if not raw:
        raise DataError(f"{path or task.hub_id}: no records")
    examples, first_row, duplicates = [], {}, {}
    for i, (where, record) in enumerate(raw[:limit] if limit else raw):
        if not isinstance(record, dict):
            raise DataError(f"{where}: a record must be a JSON object")
        row = _Row(record, where)
        question, gold, extra = task.parse(row)
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{where}: the question text is empty")
        rid = next((str(record[f]) for f in task.id_fields if record.get(f) is not None), str(i))
        if rid in first_row:
            duplicates.setdefault(rid, [first_row[rid]]).append(where)
        first_row.setdefault(rid, where)
        examples.append({"id": rid, "prompt": messages(task.kind, question), "gold": str(gold),
                         "level": "", "subject": "", "task": task.name, **extra})
    if duplicates:  # evaluation groups samples by id: duplicates would merge questions and share one gold
        shown = "; ".join(f"id {rid!r} at {', '.join(rows)}" for rid, rows in list(duplicates.items())[:5])
        raise DataError(f"{path or task.hub_id}: {len(duplicates)} duplicate example id(s): {shown}")
    return datasets.Dataset.from_list(examples)
