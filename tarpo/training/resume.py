"""What a re-run resumes from: the checkpoints :mod:`tarpo.training.checkpoints` wrote whole.

A re-run resumes from :func:`last_complete_checkpoint`: the highest-numbered ``checkpoint-N``
whose manifest matches its files; it names the incomplete ones it skips. A folder without a manifest was
not written by this version (0.1.0 reads only the checkpoints it writes, docs/design-notes.md) and is
incomplete: it lacks :data:`tarpo.training.checkpoints.MANIFEST`. A run whose final ``adapter/`` is there with
nothing left to train is finished (:func:`finished_step`). :func:`load_optimizer_on_cpu` loads a checkpoint's optimizer
where the Trainer's own load cannot (several processes on the CPU).
"""

from __future__ import annotations

import json
import os
import re

from .checkpoints import FINAL_STATE, MANIFEST, PARTIAL

TRAINER_STATE = "trainer_state.json"
EMPTY = "everything (the folder is empty)"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def missing_files(folder: str) -> list[str]:
    """What ``folder`` lacks for a resume (empty when it is a complete checkpoint): the files its manifest
    lists that are absent or of another size; :data:`MANIFEST` itself when there is none."""
    try:
        names = os.listdir(folder)
    except OSError:
        return ["the folder"]
    if not names:
        return [EMPTY]
    if MANIFEST not in names:
        return [MANIFEST]
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            listed = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{MANIFEST} (unreadable)"]
    out = []
    for rel, size in listed.items():
        path = os.path.join(folder, rel)
        if not os.path.isfile(path):
            out.append(rel)
        elif os.path.getsize(path) != size:
            out.append(f"{rel} ({os.path.getsize(path)} of {size} bytes)")
    return out


def checkpoint_folders(run_dir: str) -> list[tuple[int, str]]:
    """``(step, path)`` of every ``checkpoint-N`` folder of ``run_dir``, by step."""
    if not os.path.isdir(run_dir):
        return []
    found = []
    for name in os.listdir(run_dir):
        m = _CHECKPOINT.match(name)
        if m and os.path.isdir(os.path.join(run_dir, name)):
            found.append((int(m.group(1)), os.path.join(run_dir, name)))
    return sorted(found)


def last_complete_checkpoint(run_dir: str, report=print) -> str | None:
    """The newest complete checkpoint of ``run_dir`` (None if there is none); each incomplete one,
    and each temporary folder of an interrupted save, is named through ``report``."""
    newest = None
    for step, path in reversed(checkpoint_folders(run_dir)):
        missing = missing_files(path)
        if not missing:
            newest = newest or path
            continue
        what = "empty" if missing == [EMPTY] else "missing " + ", ".join(missing)
        report(f"skipping incomplete {os.path.basename(path)} ({what})")
    if os.path.isdir(run_dir):
        for name in sorted(os.listdir(run_dir)):
            if PARTIAL.match(name):
                report(f"skipping {name} (a save that did not finish)")
    return newest


def read_state(checkpoint: str) -> dict:
    with open(os.path.join(checkpoint, TRAINER_STATE)) as f:
        return json.load(f)


def finished_step(run_dir: str, max_steps: int, num_train_epochs: float) -> int | None:
    """The step at which the run in ``run_dir`` finished, if its final ``adapter/`` is there and nothing
    is left to train (``max_steps`` > 0: that many steps; else the same number of epochs as when it
    finished); None if training has to run (or resume)."""
    try:
        with open(os.path.join(run_dir, "adapter", FINAL_STATE)) as f:
            final = json.load(f)
        step, planned, epochs = int(final["global_step"]), int(final["max_steps"]), final["num_train_epochs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if max_steps > 0:
        target = max_steps
    elif epochs == num_train_epochs:
        target = planned
    else:
        return None
    done = [s for s, path in checkpoint_folders(run_dir) if s > step and not missing_files(path)]
    return step if step >= target and not done else None


def resume_point(resume_from_checkpoint, output_dir: str, report) -> str | None:
    """What ``Trainer.train(resume_from_checkpoint=...)`` resumes from: ``True``, the newest *complete*
    checkpoint of ``output_dir`` (the incomplete ones reported); a folder, checked complete; else None."""
    if isinstance(resume_from_checkpoint, bool):
        if not resume_from_checkpoint:
            return None
        found = last_complete_checkpoint(output_dir, report=report)
        if found is None:
            raise ValueError(f"No complete checkpoint found in output directory ({output_dir})")
        return found
    if resume_from_checkpoint is not None:
        missing = missing_files(resume_from_checkpoint)
        if missing == [MANIFEST]:
            raise ValueError(f"{resume_from_checkpoint} has no {MANIFEST}: it was not written by this version of "
                             "tarpo, which resumes only from the checkpoints it writes")
        if missing:
            raise ValueError(f"{resume_from_checkpoint} is incomplete (missing {', '.join(missing)}): resume from "
                             "a complete checkpoint (tarpo.training.resume.last_complete_checkpoint)")
    return resume_from_checkpoint


def load_optimizer_on_cpu(trainer, checkpoint: str) -> bool:
    """Processes on the CPU (``ACCELERATE_USE_CPU=true``, several of them, DDP): load the optimizer and
    scheduler states of ``checkpoint`` onto the CPU and return True. The Trainer loads them with
    ``map_location=args.device``, which accelerate names ``cpu:0`` there and ``torch.load`` cannot map
    (tests/test_fsdp.py resumes a 2-process DDP run). False, loading nothing, everywhere else."""
    args = trainer.args
    if trainer.is_fsdp_enabled or args.device.type != "cpu" or args.world_size == 1:
        return False
    optimizer, scheduler = os.path.join(checkpoint, "optimizer.pt"), os.path.join(checkpoint, "scheduler.pt")
    if not (os.path.isfile(optimizer) and os.path.isfile(scheduler)):
        return False
    import torch

    trainer.optimizer.load_state_dict(torch.load(optimizer, map_location="cpu", weights_only=True))
    trainer.lr_scheduler.load_state_dict(torch.load(scheduler, map_location="cpu", weights_only=True))
    return True
