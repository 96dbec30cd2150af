"""The task registry: every data set of the paper, loaded from the hub or a local file.

A task knows its hub id/config/split, its prompt kind (``math``, ``multiple_choice`` or
``code``, docs/algorithm.md §6), its default grader and its evaluation lengths (docs/algorithm.md §5). Each
raw record becomes one normalised example::

    {"id": str, "prompt": [system message, user message], "gold": str,
     "level": str, "subject": str, "task": name, **task fields}

(HumanEval adds ``entry_point``, ``test`` and ``code_prompt``). Local files are read by
:mod:`tarpo.tasks.local_files`, each record is parsed by its data set's parser in
:mod:`tarpo.tasks.record_parsers`, and the question gets its chat prompt from :mod:`tarpo.tasks.chat_messages`.
A malformed record raises :class:`DataError` naming the file, row and field.

    >>> TASKS["gsm8k"].hub_id, TASKS["gsm8k"].eval_lengths
    ('openai/gsm8k', (512, 512))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import datasets

from . import synthetic
from .chat_messages import messages
from .local_files import read_local
from .record_parsers import (DataError, Row, parse_arc, parse_arith, parse_dapo, parse_gpqa, parse_gsm8k,
                             parse_humaneval, parse_math, parse_olympiad)


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
    # examples as earlier chat turns, train and test split by a hash of the problem's canonical form: the
    # real-model learning check's task (docs/real-model.md)
    Task("arith_one", "arith_one", parse_arith, "gsm8k", "", eval_lengths=(256, 64),
         generate=synthetic.one_step_split),
    # two-operation problems (a ± b ± c in 1..9), the same system prompt, two two-operation worked examples: the
    # real-model tables' column where a step of reasoning matters (docs/paper-mini.md)
    Task("arith_two", "arith_two", parse_arith, "gsm8k", "", eval_lengths=(256, 64),
         generate=synthetic.two_step_split),
]}
# The MATH hub copy is split by subject; its configs are concatenated alphabetically.
MATH_SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                 "prealgebra", "precalculus")


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[name]


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
    raw = read_local(path, split) if path else _read_hub(task, split)
    if not raw:
        raise DataError(f"{path or task.hub_id}: no records")
    examples, first_row, duplicates = [], {}, {}
    for i, (where, record) in enumerate(raw[:limit] if limit else raw):
        if not isinstance(record, dict):
            raise DataError(f"{where}: a record must be a JSON object")
        row = Row(record, where)
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
