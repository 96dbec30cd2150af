"""``tarpo grade``: re-grade saved completions.

Reads a JSONL file whose lines hold ``completion`` and ``gold`` (an evaluation trajectory
file has both), grades every line with the task's grader (or ``--grader``), and writes the
lines with ``score`` (and ``answer``, ``timed_out``) added to ``--out``. The output is
written to a temporary file and renamed into place, so a failed run leaves no partial
file. The last line printed is ``graded N correct C timeouts T``.

    tarpo grade --task math500 runs/eval/math500.jsonl --out regraded.jsonl
    tarpo grade --task gsm8k --grader math_verify --reward runs/x.jsonl --out y.jsonl
"""

from __future__ import annotations

import argparse
import json

from .answers import FALLBACKS
from .files import write_text_atomic
from .graders import DEFAULT_TIMEOUT, DEFAULT_WORKERS, GRADERS, grade_batch
from .tasks import TASKS

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
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no lines to grade")
    return rows


def write_atomic(path: str, rows: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def run(args: argparse.Namespace) -> int:
    task = TASKS[args.task]
    fallbacks = tuple(f for f in args.fallbacks.split(",") if f)
    unknown = set(fallbacks) - set(FALLBACKS)
    if unknown:
        raise ValueError(f"--fallbacks: unknown {sorted(unknown)}; known: {list(FALLBACKS)}")
    rows = read_lines(args.input, task.kind)
    examples = [{**row, "task": args.task} for row in rows]
    grades = grade_batch([r["completion"] for r in rows], examples, args.grader, reward=args.reward,
                         fallbacks=fallbacks, workers=args.workers, timeout=args.timeout)
    out = [{**row, "score": g.score, "answer": g.answer, "timed_out": g.timed_out} for row, g in zip(rows, grades)]
    write_atomic(args.out, out)
    correct = sum(g.score for g in grades)
    print(f"grader {args.grader or task.grader}{' (reward rule)' if args.reward else ''}: wrote {args.out}")
    print(f"graded {len(grades)} correct {int(correct)} timeouts {sum(g.timed_out for g in grades)}")
    return 0
