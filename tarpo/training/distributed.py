"""What several processes need from the trainer and the decode loop (accelerate, DDP, gloo/NCCL).

- :func:`forward_through`: the training forward must run as the forward of the module that
  accelerate wrapped. ``DistributedDataParallel.forward`` is where DDP learns that a backward
  is coming (``reducer.prepare_for_backward``); gradients computed through the decoder called
  directly are never all-reduced, and every rank would train its own model. TARPO's scoring
  does not fit a ``model(input_ids)`` call (it rebuilds soft inputs, reads hidden states and
  scores log-probs in chunks), so the wrapped module's own ``forward`` is swapped for the
  scoring function during the call: DDP's hooks run around it as around any forward.
- :func:`same_on_every_rank`: rank 0's parameters of a module copied to every rank, for what must
  equal the model DDP trains before DDP has wrapped it (DDP starts every rank from rank 0's
  parameters): the frozen reference router is copied from the router in the trainer's ``__init__``,
  and TRL seeds every rank differently before the router is drawn.
- :func:`rollout_seed`: the noise seed of a rollout, the same on every rank and after a resume.
- :func:`all_values`: every process's values of a ragged 1-D tensor, for a statistic of the whole batch (the
  entropy quantile of ``top_entropy_quantile``).
- :func:`cpu_requested`: ``ACCELERATE_USE_CPU``, read the way accelerate reads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os

import torch
import torch.distributed as dist


@contextlib.contextmanager
def forward_as(module: torch.nn.Module, fn):
    """Within the context ``module(...)`` calls ``fn(...)`` (any wrapper around ``module``, DDP's
    included, runs as usual around it); whatever ``forward`` the instance had is put back after.

        >>> m = torch.nn.Identity()
        >>> with forward_as(m, lambda: torch.ones(1)):
        ...     m()
        tensor([1.])
        >>> m(torch.zeros(1))
        tensor([0.])
    """
    had = "forward" in module.__dict__
    previous = module.__dict__.get("forward")
    module.forward = fn
    try:
        yield
    finally:
        if had:
            module.forward = previous
        else:
            del module.forward


def forward_through(wrapped: torch.nn.Module, inner: torch.nn.Module, fn):
    """``fn()`` run as the forward of ``wrapped`` (DDP around ``inner``, or ``inner`` itself).
    ``fn`` returns a dict of tensors (DDP looks for the tensors of a forward's output)."""
    with forward_as(inner, fn):
        return wrapped()


@torch.no_grad()
def same_on_every_rank(module: torch.nn.Module) -> torch.nn.Module:
    """Rank 0's parameters and buffers of ``module`` copied into every rank's (all ranks call it together,
    each with the module on its own device); ``module`` unchanged without torch.distributed."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=0)
    return module


def all_values(accelerator, values: torch.Tensor) -> torch.Tensor:
    """Every process's 1-D ``values`` (each its own length), concatenated in rank order (all ranks call it
    together): the lengths gathered, the values padded to the longest, gathered, the padding dropped."""
    if accelerator.num_processes == 1:
        return values
    sizes = accelerator.gather(torch.tensor([values.numel()], device=values.device)).tolist()
    rows = accelerator.gather(accelerator.pad_across_processes(values, dim=0)).view(len(sizes), max(sizes))
    return torch.cat([row[:n] for row, n in zip(rows, sizes)])


def cpu_requested() -> bool:
    """ACCELERATE_USE_CPU=true: accelerate and the Trainer run every process on the CPU (gloo). A value
    they would not read is named here."""
    raw = os.environ.get("ACCELERATE_USE_CPU")
    value = "false" if raw is None else raw.strip().lower()
    if value not in ("1", "true", "yes", "y", "t", "on", "0", "false", "no", "n", "f", "off"):
        raise ValueError(f"ACCELERATE_USE_CPU={raw!r}: must be true or false")
    return value in ("1", "true", "yes", "y", "t", "on")


def rollout_seed(seed: int, step: int, index: int) -> int:
    """The noise seed of the ``index``-th rollout made at optimizer step ``step`` of a run seeded
    ``seed``: the same on every rank, in a one-process run and after a resume.

        >>> rollout_seed(0, 5, 0) == rollout_seed(0, 5, 0) != rollout_seed(0, 5, 1)
        True
    """
    return int(hashlib.sha256(f"{seed}:{step}:{index}".encode()).hexdigest()[:15], 16)


def on_any_rank(flag: torch.Tensor) -> torch.Tensor:
    """``flag`` (a bool tensor) or'ed over the processes of a distributed run, on the device (one all-reduce of
    one number): every rank then takes the same decision, also when a non-finite value has no gradient path
    for DDP's all-reduce to spread (a loss term on one rank alone). ``flag`` itself in one process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    value = flag.float().reshape(1).to(device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value[0] > 0
