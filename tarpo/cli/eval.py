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

Modes (docs/algorithm.md §3/§7): the table :data:`tarpo.routing.MODES` (``--help`` lists them).
Sampling defaults: TarpoConfig's (``--help`` prints them), router sampling, lengths per task from
docs/algorithm.md §5.

Data parallel: ``accelerate launch --multi_gpu --num_processes N -m tarpo.cli eval ...`` (or
``torchrun``; on CPUs add ``ACCELERATE_USE_CPU=true``) deals the chunks still to do to N processes;
rank 0 alone writes, and the files are those of one process with the same seed (``sample_task``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import tempfile
import time
from datetime import datetime, timedelta, timezone

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from ..config import ENTROPY_SIDES, add_flags
from ..engine.latent import HRPO_WEIGHTS
from ..engine.engine_choice import engine_for
from ..engine.rollout import RolloutSpec
from ..engine.router import ROUTER_WEIGHTS
from ..evaluation.sample import sample, score_records, summarize
from ..evaluation.trajectories import TrajectoryFile
from ..files import write_json_atomic
from ..models.loading import load_gate, load_trained, resolve_backend
from ..patches.targets import installed_version
from ..routing import ENTROPY, MODES
from ..tasks.graders import canonical_answers, grader_versions
from ..tasks.prompts import prompt_ids
from ..tasks.registry import TASKS, load_task
from ..training.distributed import cpu_requested

PACKAGES = ("tarpo", "torch", "transformers", "peft", "trl", "math-verify")

# the sampling settings of tarpo eval: flags of the TarpoConfig fields of the same names
SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "action_temperature", "soft_top_k", "entropy_threshold",
                  "entropy_temperature", "entropy_soft_when")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="base model: hub id or local folder")
    p.add_argument("--adapter", help="trained adapter folder (LoRA + router.safetensors) from the trainer")
    p.add_argument("--tasks", required=True, help=f"comma-separated task names: {', '.join(TASKS)}")
    p.add_argument("--data-dir", help="local data root holding one <task>/ folder per task (e.g. ./data/gsm8k/test.jsonl); default: the hub")
    p.add_argument("--limit", type=int, help="first N questions of each task")
    p.add_argument("--out", required=True, help="output folder (trajectories, settings, results)")
    p.add_argument("--mode", default="tarpo", choices=list(MODES),
                   help="inference mode (default tarpo): " + "; ".join(f"{m.name}: {m.help}" for m in MODES.values()))
    p.add_argument("--system", help="row label in tables (default from the mode, e.g. TARPO, CoT)")
    p.add_argument("--model-name", help="model label in tables (default: last part of --model)")
    p.add_argument("--n", type=int, help="samples per question (default 32; greedy: 1)")
    p.add_argument("--k", help="comma-separated k for pass@k and maj@k (default 1 and n)")
    add_flags(p, SAMPLING_FLAGS)  # defaults and help: TarpoConfig's
    p.add_argument("--router-argmax", action="store_true", help="route by argmax instead of sampling")
    p.add_argument("--max-prompt-length", type=int, help="default per task (docs/algorithm.md §5)")
    p.add_argument("--max-new-tokens", type=int, help="default per task (docs/algorithm.md §5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64, help="samples decoded together (a chunk is batch/n questions)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32", "float16"],
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--grader", help="override the task's grader")
    p.add_argument("--backend", default="auto", choices=["auto", "hf", "unsloth"],
                   help="auto: Unsloth (tarpo.patches) on CUDA where it is installed (scripts/install_gpu.sh), else transformers")
    p.add_argument("--engine", default="auto", choices=["auto", "eager", "compiled"],
                   help="rollout engine (tarpo.engine.rollout): auto = compiled on CUDA (either backend), eager on the "
                        "CPU; the engines draw different random streams")
    p.add_argument("--restart", action="store_true", help="delete old trajectories of these tasks and start over")


def _ks(args) -> list[int]:
    ks = [1, args.n] if not args.k else [int(k) for k in args.k.split(",") if k.strip()]
    for k in ks:
        if not 1 <= k <= args.n:
            raise ValueError(f"--k {k}: pass@k and maj@k need 1 <= k <= n (n={args.n})")
    return sorted(set(ks))


def check_system(adapter: str | None, mode: str) -> None:
    """The adapter folder holds what the inference mode needs (checked before loading)."""
    if adapter is not None and not os.path.isfile(os.path.join(adapter, "adapter_config.json")):
        raise ValueError(f"--adapter {adapter}: no adapter_config.json there (not a saved adapter)")
    rule = MODES[mode].rule
    if rule.router and not (adapter and os.path.isfile(os.path.join(adapter, ROUTER_WEIGHTS))):
        raise ValueError(f"--mode {mode} needs a trained router: --adapter must hold {ROUTER_WEIGHTS}")
    if rule.gate and not (adapter and os.path.isfile(os.path.join(adapter, HRPO_WEIGHTS))):
        raise ValueError(f"--mode {mode} needs a trained HRPO gate: --adapter must hold {HRPO_WEIGHTS}")


def check_arguments(args) -> None:
    """Every check that needs no model: fails with the name of the bad setting."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"--tasks: unknown task {', '.join(unknown) or '(none)'}; known tasks: {', '.join(TASKS)}")
    args.task_list = tasks
    if args.n is None:
        args.n = 1 if MODES[args.mode].greedy else 32
    if args.n < 1:
        raise ValueError(f"--n {args.n}: need at least one sample per question")
    if MODES[args.mode].greedy and args.n != 1:
        raise ValueError(f"--n {args.n}: mode {args.mode} takes one argmax sample per question (use --n 1)")
    if MODES[args.mode].greedy and MODES[args.mode].rule.router:
        args.router_argmax = True
    args.ks = _ks(args)
    check_system(args.adapter, args.mode)
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise ValueError(f"--data-dir {args.data_dir}: no such folder")
    for name in ("temperature", "action_temperature", "entropy_temperature"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0")
    if args.entropy_soft_when not in ENTROPY_SIDES:
        raise ValueError(f"--entropy-soft-when {args.entropy_soft_when}: must be one of {', '.join(ENTROPY_SIDES)}")
    resolve_backend(args.backend)  # refused here, before anything loads, where it cannot run
    args.engine = engine_for(args.engine, torch.cuda.is_available(), "--engine")
    if args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        raise ValueError("--batch-size and --limit must be >= 1")


def task_settings(args, task: str) -> dict:
    """Everything that decides the samples of one task (compared on resume)."""
    prompt_len, new_tokens = TASKS[task].eval_lengths
    return {
        "task": task, "model": args.model, "adapter": args.adapter, "mode": args.mode, "n": args.n,
        "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
        "action_temperature": args.action_temperature, "soft_top_k": args.soft_top_k,
        "router": "argmax" if args.router_argmax else "sample", "entropy_threshold": args.entropy_threshold,
        # only mode entropy reads it (None elsewhere, so files written before it existed still resume)
        "entropy_temperature": args.entropy_temperature if MODES[args.mode].rule.soft_when == ENTROPY else None,
        # recorded where it is not the default "high", so files written before it existed still resume
        "entropy_soft_when": (args.entropy_soft_when if MODES[args.mode].rule.soft_when == ENTROPY
                              and args.entropy_soft_when != "high" else None),
        "max_prompt_length": args.max_prompt_length or prompt_len, "max_new_tokens": args.max_new_tokens or new_tokens,
        "seed": args.seed, "limit": args.limit, "data": args.data_dir and os.path.join(args.data_dir, task),
        "grader": args.grader or TASKS[task].grader, "dtype": args.dtype,
        # the engine decides the random stream; None = eager, as files written before engines existed
        "engine": None if args.engine == "eager" else args.engine,
    }


def package_versions(names=PACKAGES) -> dict:
    """Installed version of each named distribution (None where absent), for provenance."""
    return {name: installed_version(name) for name in names}


def _math500_ids(args) -> tuple[set[str] | None, str]:
    path = args.data_dir and os.path.join(args.data_dir, "math500")
    try:
        return {ex["id"] for ex in load_task("math500", path)}, path or TASKS["math500"].hub_id
    except Exception as exc:  # noqa: BLE001 - the subset is optional; say why it is missing
        return None, f"unavailable: {exc}"


def chunk_seed(seed: int, task: str, chunk: int) -> int:
    """The seed of one chunk: fixed by (seed, task, chunk), different across tasks and chunks.

    >>> chunk_seed(0, "gsm8k", 0) == chunk_seed(0, "gsm8k", 0) != chunk_seed(0, "math", 0)
    True
    """
    return int(hashlib.sha256(f"{seed}:{task}:{chunk}".encode()).hexdigest()[:15], 16)


def load_system(model_path: str, adapter: str | None, mode: str, dtype: str = "auto", action_temperature=None,
                backend: str = "hf", device=None):
    """(model, router or None, HRPO gate or None, tokenizer, device) for an inference mode, on
    ``device`` (default CUDA when available); ``auto`` dtype = bfloat16 on CUDA, float32 on CPU."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype if dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    model, router, tokenizer = load_trained(model_path, adapter, dtype=dtype, device=device, backend=backend)
    model.eval()
    if router is not None and action_temperature is not None:
        router.temperature = action_temperature
    rule = MODES[mode].rule
    gate = load_gate(adapter, device) if rule.gate else None
    return model, (router if rule.router else None), gate, tokenizer, device


def processes() -> tuple[int, int, torch.device | None]:
    """(rank, number of processes, device) of this eval process: (0, 1, None) unless a launcher
    (``accelerate launch --multi_gpu``, ``torchrun``) started several, which set ``WORLD_SIZE``.

    The ranks exchange only Python objects, so the process group is gloo on every device (NCCL's
    watchdog would also stop ranks that wait while rank 0 grades); the device is the rank's own
    GPU (``LOCAL_RANK``), or the CPU without CUDA or with ``ACCELERATE_USE_CPU=true``."""
    if not (dist.is_available() and dist.is_initialized()):
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return 0, 1, None
        dist.init_process_group("gloo", timeout=timedelta(hours=2))
    if torch.cuda.is_available() and not cpu_requested():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def rank0_first(rank: int, world: int, fn):
    """``fn(rank)`` on rank 0 first, then on the other ranks, so that they see the files as rank 0
    left them; a failure on rank 0 (a bad setting, an old file with other settings) is raised on
    every rank, before any of them loads a model."""
    if world == 1:
        return fn(rank)
    error = [None]
    if rank == 0:
        try:
            result = fn(rank)
        except Exception as exc:
            error = [(type(exc) if isinstance(exc, (ValueError, FileNotFoundError)) else RuntimeError, str(exc))]
            raise
        finally:
            dist.broadcast_object_list(error, src=0)
        return result
    dist.broadcast_object_list(error, src=0)
    if error[0] is not None:
        raise error[0][0](error[0][1])
    return fn(rank)


def longest_prompt(tokenizer, examples: list, max_prompt_length: int) -> int:
    """The longest of the task's prompts in tokens, as :func:`tarpo.tasks.prompts.encode_prompts` cuts them."""
    return max(len(prompt_ids(tokenizer, ex["prompt"], max_prompt_length, i)[0]) for i, ex in enumerate(examples))


def sample_task(args, task: str, examples: list, traj: TrajectoryFile, model, router, gate, tokenizer, device,
                rank: int = 0, world: int = 1) -> int:
    """Sample and grade the chunks not yet on disk and append them to ``traj``; returns how many
    samples were added (on rank 0; 0 elsewhere).

    With ``world`` processes the chunks still to do are dealt round-robin: in round ``k`` rank
    ``r`` samples the ``k*world + r``-th of them, with the chunk's own seed and batch as one
    process would, and rank 0 gathers the round and appends its chunks in order. So the file is
    the one a single process writes, and a run killed between appends resumes like one."""
    s = traj.settings
    spec = RolloutSpec(max_new_tokens=s["max_new_tokens"], temperature=s["temperature"], top_k=s["top_k"],
                       top_p=s["top_p"], soft_top_k=s["soft_top_k"], entropy_threshold=s["entropy_threshold"],
                       entropy_temperature=args.entropy_temperature,
                       entropy_soft_when=args.entropy_soft_when, router_greedy=args.router_argmax,
                       engine=s.get("engine") or "eager")
    if spec.engine != "eager":  # one compiled graph per task: its longest prompt, every chunk padded to a full one
        spec = dataclasses.replace(spec, batch_size=traj.settings["questions_per_chunk"] * args.n,
                                   max_prompt_length=longest_prompt(tokenizer, examples, s["max_prompt_length"]))
    todo = list(range(traj.done_chunks(), len(traj.chunks)))
    fresh = 0
    bar = tqdm(total=len(examples) * args.n, initial=len(traj.records), desc=task, unit="sample", mininterval=2,
               disable=rank != 0)
    for first in range(0, len(todo), world):
        records = None
        if first + rank < len(todo):
            c = todo[first + rank]
            start, stop = traj.chunks[c]
            generator = torch.Generator(device).manual_seed(chunk_seed(args.seed, task, c))
            chunk = examples[start:stop]
            records = sample(model, router, tokenizer, chunk, args.n, spec, mode=args.mode,
                             max_prompt_length=s["max_prompt_length"], batch_size=len(chunk) * args.n,
                             generator=generator, gate=gate)
            records = score_records(records, chunk, grader=s["grader"])
            records = [{"q": start + i // args.n, **r} for i, r in enumerate(records)]
        gathered = [records]
        if world > 1:
            gathered = [None] * world if rank == 0 else None
            dist.gather_object(records, gathered, dst=0)
        if rank == 0:
            for chunk_records in gathered[:len(todo) - first]:  # in chunk order; None: a rank without a chunk
                traj.append(chunk_records)
                fresh += len(chunk_records)
                bar.update(len(chunk_records))
    bar.close()
    return fresh


def task_results(args, task: str, traj: TrajectoryFile, device, rate: float, world: int = 1) -> dict:
    """The metrics and provenance of a task whose trajectories are all on disk."""
    s = traj.settings
    records = traj.records
    canonical = canonical_answers([r["answer"] for r in records], task)
    metrics = summarize(records, args.ks, canonical)
    subsets = {}
    if task == "math":
        ids, where = _math500_ids(args)
        if ids is None:
            subsets["math500"] = {"error": where}
        else:
            keep = [j for j, r in enumerate(records) if r["id"] in ids]
            if keep:
                subsets["math500"] = {**summarize([records[j] for j in keep], args.ks, [canonical[j] for j in keep]),
                                      "ids_from": where}
    return {
        "task": task, "system": args.system or MODES[args.mode].system,
        "model_name": args.model_name or os.path.basename(os.path.normpath(args.model)),
        "model": args.model, "adapter": args.adapter, "mode": args.mode, "n": args.n, "seed": args.seed,
        "metrics": metrics, "subsets": subsets, "settings": s, "grader": grader_versions(s["grader"]),
        "packages": package_versions(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": str(device), "processes": world, "samples_per_s": rate,
        "trajectories": os.path.basename(traj.path),
    }


def summary_line(res: dict) -> str:
    m = res["metrics"]
    parts = [f"{k} {m[k]:.4f}" for k in m if k.startswith(("pass@", "maj@"))]
    line = (f"{res['task']}: " + " ".join(parts) + f" sd {m['accuracy_sd']:.4f} ci95 {m['accuracy_ci95']:.4f} "
            f"units {m['units']:.1f} hard {m['hard_tokens']:.1f} soft_ratio {m['soft_ratio']:.4f} "
            f"({m['questions']} questions x {res['n']} samples)")
    sub = res["subsets"].get("math500")
    if sub and "pass@1" in sub:
        line += f"; math500 subset pass@1 {sub['pass@1']:.4f} ({sub['questions']} questions)"
    return line


def check_out(out: str) -> None:
    """``--out`` is a folder this process can write into, or can be created: checked before any
    model is loaded and before anything is written (an existing folder gets a probe file)."""
    parent = os.path.abspath(out)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"--out {out}: {parent} exists and is not a folder")
    try:
        if parent == os.path.abspath(out):
            with tempfile.TemporaryFile(dir=parent):
                pass
        elif not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(f"cannot create a folder in {parent}")
    except OSError as exc:
        raise ValueError(f"--out {out}: not writable ({exc.strerror or exc})") from None


def run(args) -> int:
    """Evaluate every task; launched with several processes, the chunks are split between them
    (:func:`sample_task`) and rank 0 alone writes the files and computes the results."""
    check_arguments(args)
    check_out(args.out)
    rank, world, device = processes()

    def plan(rank):  # data and resume files are checked before any model is loaded
        plans = []
        for task in args.task_list:
            examples = list(load_task(task, args.data_dir and os.path.join(args.data_dir, task), limit=args.limit))
            per_chunk = max(1, args.batch_size // args.n)
            traj = TrajectoryFile(args.out, task, task_settings(args, task), len(examples), per_chunk,
                                  args.restart and rank == 0)  # rank 0 deletes or truncates, the others read
            plans.append((task, examples, traj))
        os.makedirs(args.out, exist_ok=True)
        return plans

    plans = rank0_first(rank, world, plan)
    model, router, gate, tokenizer, device = load_system(args.model, args.adapter, args.mode, args.dtype,
                                                         args.action_temperature, args.backend, device)
    for task, examples, traj in plans:
        started = time.time()
        fresh = sample_task(args, task, examples, traj, model, router, gate, tokenizer, device, rank, world)
        if rank == 0:
            res = task_results(args, task, traj, device, fresh / max(time.time() - started, 1e-9), world)
            write_json_atomic(os.path.join(args.out, f"{task}.results.json"), res)
            print(summary_line(res), flush=True)
    if rank == 0:
        print(f"results in {os.path.abspath(args.out)}")
    return 0
