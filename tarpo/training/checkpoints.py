"""Checkpoints that a kill or a full disk cannot leave half-written.

A save never writes into ``<run>/checkpoint-N`` (nor into ``<run>/adapter``): it writes into a
temporary folder beside it (``<run>/.checkpoint-N.tmp/checkpoint-N``, ``<run>/.adapter.tmp``), the
router, the reference router, the soft input and the routing rule's settings included, then a manifest of every file
and its size (:data:`MANIFEST`) last; every file is fsynced and the folder is renamed into place
(:func:`publish`). A kill at any point leaves the previous checkpoints as they were and a hidden
temporary folder that no one resumes from (:func:`remove_partial_saves` deletes it).

A re-run resumes only from a checkpoint whose manifest matches its files (:mod:`tarpo.training.resume`). A save
that runs out of disk space (:func:`is_disk_full`: ``ENOSPC``, or the errno-less errors that torch's zip writer raises
on a full disk) raises :class:`DiskFull` naming the checkpoint and the folder, and leaves nothing of it.

The final ``adapter/`` is written the same way by :func:`save_final`, with :data:`FINAL_STATE`
(the step it was saved at and the planned number of steps): :func:`tarpo.training.resume.finished_step` tells a
re-run of a finished run that there is nothing to do.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil

from ..algorithms import RULE_SETTINGS, rule_settings
from ..atomic_files import publish_folder as publish  # what a checkpoint save publishes with (tarpo.atomic_files)
from ..atomic_files import write_json_atomic

MANIFEST = "checkpoint_manifest.json"
FINAL_STATE = "final_state.json"
PARTIAL = re.compile(r"^\.(checkpoint-\d+|adapter)\.(tmp|old)$")

# Disk full: errno ENOSPC / EDQUOT anywhere in the exception chain, or their words (safetensors'
# "No space left on device (os error 28)"); torch.save's zip writer reports a full disk without an
# errno ("[enforce fail at inline_container.cc:...] . unexpected pos 640 vs 598", caused by
# "basic_ios::clear: iostream error"), which counts as one when the disk has (almost) no room left.
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_DISK_FULL_WORDS = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")
_WRITE_FAILED_WORDS = ("inline_container", "pytorchstreamwriter", "iostream error", "file write failed")
LOW_SPACE = 64 << 20  # bytes


class DiskFull(OSError):
    """A save ran out of disk space; what it had written is removed."""

    def __init__(self, what: str, folder: str, cause: BaseException):
        free = _free_bytes(folder)
        room = f" ({free / 2**20:.1f} MiB free there)" if free is not None else ""
        super().__init__(errno.ENOSPC, f"disk full while saving {what} to {folder}: {type(cause).__name__}: "
                                       f"{cause}{room}. Free some space and run again: the run resumes from its "
                                       "last complete checkpoint")

    def __str__(self) -> str:
        return self.strerror


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _free_bytes(folder: str) -> int | None:
    path = os.path.abspath(folder)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def is_disk_full(exc: BaseException, folder: str) -> bool:
    """Whether ``exc``, raised while writing into ``folder``, means that the disk is full."""
    chain = list(_chain(exc))
    if any(isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS for e in chain):
        return True
    text = " ".join(str(e).lower() for e in chain)
    if any(w in text for w in _DISK_FULL_WORDS):
        return True
    if any(w in text for w in _WRITE_FAILED_WORDS):
        free = _free_bytes(folder)
        return free is not None and free < LOW_SPACE
    return False


# ---------------------------------------------------------------- writing
def staging_folder(run_dir: str, name: str) -> str:
    """The temporary folder a save of ``<run_dir>/<name>`` writes into (hidden: no ``checkpoint-*`` glob
    of the Trainer's rotation, nor :func:`tarpo.training.resume.last_complete_checkpoint`, sees it)."""
    return os.path.join(run_dir, f".{name}.tmp")


def write_manifest(folder: str) -> None:
    """Record every file of ``folder`` and its size, as the save's last file."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            if rel != MANIFEST:
                files[rel] = os.path.getsize(path)
    with open(os.path.join(folder, MANIFEST), "w") as f:
        json.dump({"files": dict(sorted(files.items()))}, f, indent=1)


@contextlib.contextmanager
def staged_save(trainer, staging: str, what: str, parent: str):
    """Run a save into the temporary folder ``staging``, which starts empty (what a killed save
    left is removed). On an error it is removed again, and a full disk raises :class:`DiskFull`
    naming ``what`` and ``parent``. Yields whether this process writes (the main one)."""
    main = trainer.args.should_save
    if main:
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    try:
        yield main
    except Exception as exc:
        full = is_disk_full(exc, parent)
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        if full:
            raise DiskFull(what, parent, exc) from exc
        raise


class NonFiniteTensors(RuntimeError):
    """A save refused: a trained tensor holds NaN or inf."""


def refuse_nonfinite(model, what: str) -> None:
    """Raise :class:`NonFiniteTensors` naming ``what`` and the tensors when a trained tensor of ``model`` (LoRA, the
    router, the soft input's) holds NaN or inf: no checkpoint or adapter is written with one. One host read per
    save (tarpo.training.nonfinite keeps such values out of the parameters in the first place)."""
    import torch

    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trained:
        return
    from .distributed import on_any_rank

    finite = torch.stack([torch.isfinite(getattr(p, "_local_tensor", p).detach()).all() for _, p in trained])
    bad = ~finite.all()
    # FSDP2: each rank reads its own shards; the ranks decide together, so that none waits alone in the save's
    # collectives while another raises (one all-reduce of one number). Unsharded, each rank holds every value: no
    # collective (a save made on one rank alone must not wait for the others)
    if any(hasattr(p, "_local_tensor") for _, p in trained):
        bad = on_any_rank(bad)
    if not bool(bad):
        return
    bad = [n for (n, _), ok in zip(trained, finite.tolist()) if not ok]
    where = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "") if bad else "on another process's shards"
    raise NonFiniteTensors(f"refusing to save {what}: {len(bad) or 'some'} trained tensor(s) hold NaN or inf "
                           f"({where})")


def save_final(trainer, folder: str) -> str:
    """Save the trainer's adapter and router into ``folder`` (the run's ``adapter/``) atomically, with
    :data:`FINAL_STATE`; a full disk raises :class:`DiskFull` and leaves ``folder`` as it was."""
    parent, name = os.path.split(os.path.abspath(folder))
    staged = staging_folder(parent, name)
    with staged_save(trainer, staged, name, parent) as main:
        trainer.save_model(staged)
        if main:
            state = trainer.state
            with open(os.path.join(staged, FINAL_STATE), "w") as f:
                json.dump({"global_step": state.global_step, "max_steps": state.max_steps,
                           "num_train_epochs": state.num_train_epochs}, f, indent=1)
    trainer.accelerator.wait_for_everyone()
    if main:
        publish(staged, folder)
    return folder


def remove_partial_saves(run_dir: str) -> list[str]:
    """Delete the temporary folders of saves that a kill or a full disk interrupted; returns their names."""
    if not os.path.isdir(run_dir):
        return []
    gone = []
    for name in sorted(os.listdir(run_dir)):
        if PARTIAL.match(name) and os.path.isdir(os.path.join(run_dir, name)):
            shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
            gone.append(name)
    return gone


REF_ROUTER_DIR = "router_ref"


def save_heads(directory: str, router, ref_router, soft_input, args) -> None:
    """The router, the frozen reference router, the soft input (its parameters and settings,
    :meth:`tarpo.engine.soft_input.SoftInputBase.save`) and the routing rule's settings
    (:data:`tarpo.algorithms.RULE_SETTINGS`, what evaluation decodes with) into ``directory``. Every process calls
    it (``args.should_save``: the one that writes): under FSDP2 the router and the soft input are gathered first."""
    from . import sharding
    router_state = sharding.whole_state_dict(router) if router is not None else None
    soft_state = sharding.whole_state_dict(soft_input) if soft_input.kind.trained else None
    if args.should_save:
        if router is not None:  # a routing without a router (GRPO) saves none
            router.save(directory, router_state)
            ref_router.save(os.path.join(directory, REF_ROUTER_DIR))
        soft_input.save(directory, soft_state)
        write_json_atomic(os.path.join(directory, RULE_SETTINGS), rule_settings(args))


def load_heads(checkpoint: str, router, soft_input, device):
    """The router and the soft input's trained parameters of ``checkpoint`` loaded into ``router`` and
    ``soft_input`` (sharded or not; ``router`` None: the routing has none); returns its frozen reference router on
    ``device`` (None without a router)."""
    from ..engine.router import Router
    from . import sharding
    if soft_input.kind.trained:
        sharding.load_whole(soft_input, type(soft_input).load(checkpoint).state_dict())
    if router is None:  # a routing without a router
        return None
    sharding.load_whole(router, Router.load(checkpoint).state_dict())
    return Router.load(os.path.join(checkpoint, REF_ROUTER_DIR), device=device).requires_grad_(False)
