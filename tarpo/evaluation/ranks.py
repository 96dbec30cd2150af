"""The processes of a data-parallel evaluation (docs/several-gpus.md): ``accelerate launch
--multi_gpu`` or ``torchrun`` starts several, each samples its share of the chunks, and rank 0
alone reads and writes the files (:func:`tarpo.evaluation.pipeline.sample_task`)."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from ..training.distributed import cpu_requested


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
