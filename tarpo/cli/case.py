"""``tarpo case``: an HTML page of sampled completions for chosen questions (case studies).

    tarpo case --model Qwen/Qwen2.5-3B-Instruct --adapter runs/math/adapter --task math500 \\
        --ids test/precalculus/807.json,test/algebra/1.json --n 8 --out case.html

Each question gets ``--n`` samples (one group) from the rollout engine in ``--mode``; each
sample shows its training reward (the format rule of docs/algorithm.md §6) and its group-relative
advantage. Soft steps are highlighted, the stronger the higher the router's soft
probability; hovering a soft step shows the top-k tokens of its mixture and their weights.
"""

from __future__ import annotations

import argparse
import os

from ..config import add_flags
from ..evaluation.case_study import case_study
from ..evaluation.system import RUN_FLAGS
from ..atomic_files import write_text_atomic
from ..models.gguf import check_gguf, gguf_folder, is_gguf
from ..algorithms import MODES
from ..tasks.registry import TASKS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="base model: hub id, local folder or .gguf file")
    p.add_argument("--adapter")
    p.add_argument("--mode", default="tarpo", choices=list(MODES))
    p.add_argument("--task", required=True, choices=sorted(TASKS))
    p.add_argument("--data-dir", help="local data root holding <task>/")
    p.add_argument("--ids", required=True, help="comma-separated question ids")
    p.add_argument("--n", type=int, default=8, help="samples per question (one group)")
    add_flags(p, ("temperature", "soft_top_k", *RUN_FLAGS), from_run=RUN_FLAGS)  # defaults and help: TarpoConfig's
    p.add_argument("--max-new-tokens", type=int, help="default: the task's evaluation length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="HTML file to write")


def run(args) -> int:
    """Write the page (:func:`tarpo.evaluation.case_study.case_study`) to ``--out``."""
    if is_gguf(args.model):  # checked, then converted once into runs/cache/gguf (tarpo.models.gguf)
        check_gguf(args.model, f"--model {args.model}")
        args.model = gguf_folder(args.model, label="--model")
    write_text_atomic(args.out, case_study(args))
    print(os.path.abspath(args.out))
    return 0
