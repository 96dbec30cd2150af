"""``tarpo grade``: re-grade saved completions.

Reads a JSONL file whose lines hold ``completion`` and ``gold`` (an evaluation trajectory
file has both), grades every line with the task's grader (or ``--grader``), and writes the
lines with ``score`` (and ``answer``, ``timed_out``) added to ``--out``. Graded lines are
appended to ``<out>.partial`` chunk by chunk as they are produced, and the file is renamed to
``--out`` when every line is graded: a killed run leaves no ``--out`` and keeps what it graded.
An input line that could not be written back (text that is not valid Unicode, such as a lone
surrogate escape) is refused before grading, naming the line. The last line printed is
``graded N correct C timeouts T``.

    tarpo grade --task math500 runs/eval/math500.jsonl --out regraded.jsonl
    tarpo grade --task gsm8k --grader math_verify --reward runs/x.jsonl --out y.jsonl
"""

from __future__ import annotations

import argparse
import json
import os

from ..tasks.answers import FALLBACKS
from ..tasks.graders import DEFAULT_TIMEOUT, DEFAULT_WORKERS, GRADERS, grade_batch
from ..tasks.registry import TASKS

REQUIRED = {"code": ("completion", "gold", "entry_point", "test", "code_prompt")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="JSONL file with 'completion' and 'gold' on every line")
    parser.add_argument("--task", required=True, choices=sorted(TASKS), help="task whose grader and answer tag apply")
    parser.add_argument("--grader", choices=sorted(GRADERS), help="override the task's default grader")
    parser.add_argument("--out", required=True, help="where to write the graded lines (JSONL)")
    parser.add_argument("--reward", action="store_true",
                        help="apply the training reward's format rule (exactly one answer tag, no fallbacks)")
    parser.add_argument("--fallbacks", default=",".join(FALLBACKS),
                        help="answer fallbacks when no tag is present, in order ('' for none)")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="parallel grading processes")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per answer")


def read_lines(path: str, kind: str) -> list[dict]:
    """Every line as a dict; the first bad line raises ``ValueError`` naming file, line and field."""
    required = REQUIRED.get(kind, ("completion", "gold"))
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {n}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}: line {n}: not a JSON object")
            for name in required:
                if not isinstance(row.get(name), str):
                    raise ValueError(f"{path}: line {n}: field {name!r} is missing or not a string")
            try:
                _encode(row)
            except UnicodeEncodeError as exc:
                raise ValueError(f"{path}: line {n}: text that cannot be written as UTF-8 ({exc.reason}: "
                                 f"{exc.object[exc.start:exc.end]!r})") from None
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no lines to grade")
    return rows


def _encode(row: dict) -> bytes:
    return (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")


CHUNK = 256  # lines graded (and written) at a time


def run(args: argparse.Namespace) -> int:
    task = TASKS[args.task]
    fallbacks = tuple(f for f in args.fallbacks.split(",") if f)
    unknown = set(fallbacks) - set(FALLBACKS)
    if unknown:
        raise ValueError(f"--fallbacks: unknown {sorted(unknown)}; known: {list(FALLBACKS)}")
    rows = read_lines(args.input, task.kind)
    partial = args.out + ".partial"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    grades = []
    with open(partial, "wb") as f:
        for start in range(0, len(rows), CHUNK):
            chunk = rows[start:start + CHUNK]
            got = grade_batch([r["completion"] for r in chunk], [{**r, "task": args.task} for r in chunk],
                              args.grader, reward=args.reward, fallbacks=fallbacks, workers=args.workers,
                              timeout=args.timeout)
            f.write(b"".join(_encode({**r, "score": g.score, "answer": g.answer, "timed_out": g.timed_out})
                             for r, g in zip(chunk, got)))
            f.flush()
            grades += got
        os.fsync(f.fileno())
    os.replace(partial, args.out)
    correct = sum(g.score for g in grades)
    print(f"grader {args.grader or task.grader}{' (reward rule)' if args.reward else ''}: wrote {args.out}")
    print(f"graded {len(grades)} correct {int(correct)} timeouts {sum(g.timed_out for g in grades)}")
    return 0
