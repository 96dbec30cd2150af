"""``tarpo eval``: sample and grade a model on benchmarks, resumably, with the paper's metrics.

    tarpo eval --model Qwen/Qwen2.5-3B-Instruct --adapter runs/math/adapter --mode tarpo \\
        --tasks math,amc23,olympiadbench --system TARPO --out runs/math/eval
    python -m tarpo.cli eval --model ./tiny --tasks gsm8k --data-dir ./data --limit 20 --n 4 --out ev

For each task it writes, in ``--out``: ``<task>.jsonl`` (one trajectory per line: question
id, sample index, text, text with soft steps marked, placeholder tokens, actions, router
soft probabilities, units, hard tokens, extracted answer, score), ``<task>.settings.json``
and, when the task is complete, ``<task>.results.json`` (every metric of docs/algorithm.md §7 and the
provenance: model, adapter, task, n, settings, seed, grader and versions, packages, date).
Running the same command again continues where it stopped; changed settings refuse to
mix with an old file unless ``--restart``. For ``math`` the MATH-500 subset is reported
from the same run when the MATH-500 ids can be loaded.

Modes (docs/algorithm.md §3/§7): the table :data:`tarpo.algorithms.MODES` (``--help`` lists them).
Sampling defaults: TarpoConfig's (``--help`` prints them), router sampling, lengths per task from
docs/algorithm.md §5; the routing rule's own settings (mode entropy's threshold, temperature and side) are the
trained run's, saved beside its adapter (``routing_settings.json``), unless a flag sets them.

Data parallel: ``accelerate launch --multi_gpu --num_processes N -m tarpo.cli eval ...`` (or
``torchrun``; on CPUs add ``ACCELERATE_USE_CPU=true``) deals the chunks still to do to N processes;
rank 0 alone writes, and the files are those of one process with the same seed
(``tarpo.evaluation.pipeline.sample_task``).
"""

from __future__ import annotations

import argparse
import os

import torch

from ..atomic_files import check_writable_folder
from ..config import add_flags
from ..engineering_fields import ENGINES
from ..method_fields import sampling_problem
from ..engine.engine_choice import engine_for
from ..evaluation.pipeline import evaluate
from ..evaluation.system import RUN_FLAGS, check_system, fill_run_settings
from ..models.loading import BACKENDS, DTYPES, resolve_backend
from ..models.gguf import check_gguf, gguf_folder, is_gguf
from ..models.quantized import check_not_quantized
from ..algorithms import MODES, SAMPLES
from ..tasks.registry import TASKS

# the sampling settings of tarpo eval: flags of the TarpoConfig fields of the same names (those of RUN_FLAGS: the
# trained run's by default, read beside its adapter)
SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "action_temperature", "soft_top_k", *RUN_FLAGS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="base model: hub id, local folder or .gguf file")
    p.add_argument("--adapter", help="trained adapter folder (LoRA + router.safetensors) from the trainer")
    p.add_argument("--tasks", required=True, help=f"comma-separated task names: {', '.join(TASKS)}")
    p.add_argument("--data-dir",
                   help="local data root holding one <task>/ folder per task (e.g. ./data/gsm8k/test.jsonl); "
                        "default: the hub")
    p.add_argument("--limit", type=int, help="first N questions of each task")
    p.add_argument("--out", required=True, help="output folder (trajectories, settings, results)")
    p.add_argument("--mode", default="tarpo", choices=list(MODES),
                   help="inference mode (default tarpo): " + "; ".join(f"{m.name}: {m.help}" for m in MODES.values()))
    p.add_argument("--system", help="row label in tables (default from the mode, e.g. TARPO, CoT)")
    p.add_argument("--model-name", help="model label in tables (default: last part of --model)")
    p.add_argument("--n", type=int, help=f"samples per question (default {SAMPLES}; greedy: 1)")
    p.add_argument("--k", help="comma-separated k for pass@k and maj@k (default 1 and n)")
    add_flags(p, SAMPLING_FLAGS, from_run=RUN_FLAGS)  # defaults and help: TarpoConfig's
    p.add_argument("--router-argmax", action="store_true", help="route by argmax instead of sampling")
    p.add_argument("--max-prompt-length", type=int, help="default per task (docs/algorithm.md §5)")
    p.add_argument("--max-new-tokens", type=int, help="default per task (docs/algorithm.md §5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64,
                   help="samples decoded together (a chunk is batch/n questions)")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--grader", help="override the task's grader")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="auto: Unsloth (tarpo.patches) on CUDA where it is installed (scripts/install_gpu.sh), "
                        "else transformers")
    p.add_argument("--engine", default="auto", choices=ENGINES,
                   help="rollout engine (tarpo.engine.rollout): auto = compiled on CUDA (either backend), eager on "
                        "the CPU; the engines draw different random streams")
    p.add_argument("--restart", action="store_true",
                   help="delete old trajectories of these tasks and start over")


def _ks(args) -> list[int]:
    ks = [1, args.n] if not args.k else [int(k) for k in args.k.split(",") if k.strip()]
    for k in ks:
        if not 1 <= k <= args.n:
            raise ValueError(f"--k {k}: pass@k and maj@k need 1 <= k <= n (n={args.n})")
    return sorted(set(ks))


def check_arguments(args) -> None:
    """Every check that needs no model: fails with the name of the bad setting."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"--tasks: unknown task {', '.join(unknown) or '(none)'}; known tasks: {', '.join(TASKS)}")
    args.task_list = tasks
    if args.n is None:
        args.n = MODES[args.mode].samples
    if args.n < 1:
        raise ValueError(f"--n {args.n}: need at least one sample per question")
    if MODES[args.mode].greedy and args.n != 1:
        raise ValueError(f"--n {args.n}: mode {args.mode} takes one argmax sample per question (use --n 1)")
    if MODES[args.mode].greedy and MODES[args.mode].rule.router:
        args.router_argmax = True
    args.ks = _ks(args)
    check_system(args.adapter, args.mode)
    fill_run_settings(args)  # the routing settings the run was trained with, where no flag sets them
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise ValueError(f"--data-dir {args.data_dir}: no such folder")
    if (problem := sampling_problem(args)) is not None:  # the sampling flags: TarpoConfig's fields and rule
        name, why = problem
        raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: {why}")
    if is_gguf(args.model):
        check_gguf(args.model, f"--model {args.model}")
    else:
        check_not_quantized(args.model, f"--model {args.model}")
    resolve_backend(args.backend)  # refused here, before anything loads, where it cannot run
    args.engine = engine_for(args.engine, torch.cuda.is_available(), "--engine")
    if args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        raise ValueError("--batch-size and --limit must be >= 1")


def run(args) -> int:
    """Check the flags and ``--out``, then evaluate every task (:func:`tarpo.evaluation.pipeline.evaluate`)."""
    check_arguments(args)
    check_writable_folder(args.out, f"--out {args.out}")
    if is_gguf(args.model):  # converted once into runs/cache/gguf (tarpo.models.gguf)
        args.model = gguf_folder(args.model, label="--model")
    evaluate(args)
    return 0
