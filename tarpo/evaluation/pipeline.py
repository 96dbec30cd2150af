"""The pipeline of ``tarpo eval``: plan each task (its data, its settings, its resumable trajectory
file), sample and grade the chunks not yet on disk across the ranks, and write each task's results.

Per task it writes, in ``args.out``, ``<task>.jsonl`` and ``<task>.settings.json``
(:class:`tarpo.evaluation.trajectories.TrajectoryFile`) and, when the task is complete,
``<task>.results.json`` (:func:`tarpo.evaluation.results.task_results`). ``args`` is the namespace
of ``tarpo eval``'s flags, completed by :func:`tarpo.cli.eval.check_arguments` (``task_list``, ``n``,
``ks``, ``engine``). Launched with several processes (:func:`tarpo.evaluation.ranks.processes`), the
chunks still to do are dealt to them and rank 0 alone writes; the files are those of one process
with the same seed (:func:`sample_task`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from ..atomic_files import write_json_atomic
from ..engine.decode_weights import weights_held
from ..algorithms import ENTROPY, MODES
from ..tasks.prompts import prompt_ids
from ..tasks.registry import TASKS, load_task
from .ranks import processes, rank0_first
from .results import summary_line, task_results
from .sample import sample, score_records
from .system import load_system, rollout_spec
from .trajectories import TrajectoryFile


def task_settings(args, task: str) -> dict:
    """Everything that decides the samples of one task (compared on resume)."""
    prompt_len, new_tokens = TASKS[task].eval_lengths
    return {
        "task": task, "model": args.model, "adapter": args.adapter, "mode": args.mode, "n": args.n,
        "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
        "action_temperature": args.action_temperature, "soft_top_k": args.soft_top_k,
        "router": "argmax" if args.router_argmax else "sample", "entropy_threshold": args.entropy_threshold,
        # only mode entropy reads them (None elsewhere: another mode's file resumes whatever they are)
        "entropy_temperature": args.entropy_temperature if MODES[args.mode].rule.soft_when == ENTROPY else None,
        "entropy_soft_when": args.entropy_soft_when if MODES[args.mode].rule.soft_when == ENTROPY else None,
        "max_prompt_length": args.max_prompt_length or prompt_len, "max_new_tokens": args.max_new_tokens or new_tokens,
        "seed": args.seed, "limit": args.limit, "data": args.data_dir and os.path.join(args.data_dir, task),
        "grader": args.grader or TASKS[task].grader, "dtype": args.dtype,
        "engine": args.engine,  # the engine decides the random stream
    }


def chunk_seed(seed: int, task: str, chunk: int) -> int:
    """The seed of one chunk: fixed by (seed, task, chunk), different across tasks and chunks.

    >>> chunk_seed(0, "gsm8k", 0) == chunk_seed(0, "gsm8k", 0) != chunk_seed(0, "math", 0)
    True
    """
    return int(hashlib.sha256(f"{seed}:{task}:{chunk}".encode()).hexdigest()[:15], 16)


def longest_prompt(tokenizer, examples: list, max_prompt_length: int, template_kwargs=None) -> int:
    """The longest of the task's prompts in tokens, as :func:`tarpo.tasks.prompts.encode_prompts` cuts them."""
    return max(len(prompt_ids(tokenizer, ex["prompt"], max_prompt_length, i, template_kwargs)[0])
               for i, ex in enumerate(examples))


def sample_task(args, task: str, examples: list, traj: TrajectoryFile, system, rank: int = 0, world: int = 1) -> int:
    """Sample and grade the chunks not yet on disk and append them to ``traj`` with ``system``
    (:class:`tarpo.evaluation.system.System`); returns how many samples were added (on rank 0; 0 elsewhere).

    With ``world`` processes the chunks still to do are dealt round-robin: in round ``k`` rank
    ``r`` samples the ``k*world + r``-th of them, with the chunk's own seed and batch as one
    process would, and rank 0 gathers the round and appends its chunks in order. So the file is
    the one a single process writes, and a run killed between appends resumes like one."""
    saved = traj.settings  # the task's settings, as its trajectory file records them
    spec = rollout_spec(saved)
    if spec.engine != "eager":  # one compiled graph per task: its longest prompt, every chunk padded to a full one
        spec = dataclasses.replace(spec, batch_size=saved["questions_per_chunk"] * args.n,
                                   max_prompt_length=longest_prompt(system.tokenizer, examples,
                                                                    saved["max_prompt_length"],
                                                                    system.template_kwargs))
    todo = list(range(traj.done_chunks(), len(traj.chunks)))
    fresh = 0
    bar = tqdm(total=len(examples) * args.n, initial=len(traj.records), desc=task, unit="sample", mininterval=2,
               disable=rank != 0)
    for first in range(0, len(todo), world):
        records = None
        if first + rank < len(todo):
            c = todo[first + rank]
            start, stop = traj.chunks[c]
            generator = torch.Generator(system.device).manual_seed(chunk_seed(args.seed, task, c))
            chunk = examples[start:stop]
            records = sample(system, chunk, args.n, spec, max_prompt_length=saved["max_prompt_length"],
                             batch_size=len(chunk) * args.n, generator=generator)
            records = score_records(records, chunk, grader=saved["grader"])
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


def plan_tasks(args, rank: int) -> list[tuple[str, list, TrajectoryFile]]:
    """(task, examples, trajectory file) for each task: the data and the resume files are checked
    here, before any model is loaded; rank 0 deletes or truncates old files, the other ranks read."""
    plans = []
    for task in args.task_list:
        examples = list(load_task(task, args.data_dir and os.path.join(args.data_dir, task), limit=args.limit))
        per_chunk = max(1, args.batch_size // args.n)
        traj = TrajectoryFile(args.out, task, task_settings(args, task), len(examples), per_chunk,
                              args.restart and rank == 0)
        plans.append((task, examples, traj))
    os.makedirs(args.out, exist_ok=True)
    return plans


def evaluate(args) -> None:
    """Evaluate every task; launched with several processes, the chunks are split between them
    (:func:`sample_task`) and rank 0 alone writes the files and computes the results."""
    rank, world, device = processes()
    plans = rank0_first(rank, world, lambda rank: plan_tasks(args, rank))
    system = load_system(args.model, args.adapter, args.mode, args.dtype, args.action_temperature, args.backend,
                         device)
    device = system.device
    with weights_held():  # the compiled engine's decode weights built once: the model does not change here
        for task, examples, traj in plans:
            started = time.time()
            fresh = sample_task(args, task, examples, traj, system, rank, world)
            if rank == 0:
                res = task_results(args, task, traj, device, fresh / max(time.time() - started, 1e-9), world)
                write_json_atomic(os.path.join(args.out, f"{task}.results.json"), res)
                print(summary_line(res), flush=True)
    if rank == 0:
        print(f"results in {os.path.abspath(args.out)}")
