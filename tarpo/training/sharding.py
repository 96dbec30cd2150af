"""Sharded parameters: FSDP2 (``torch.distributed.fsdp.fully_shard``) through accelerate (docs/several-gpus.md).

Under FSDP2 every parameter outside a running module's forward is this rank's shard (a ``DTensor``). The
trainer reads some of them directly, not through their module's forward: the rollout indexes the
embedding matrix and runs the decoder step by step (the compiled engine reads every layer's weights
itself), the training forward builds soft inputs from the embedding, scores log-probs from the head in
chunks, and calls the router and HRPO's gate. So:

- **Rollout**: :func:`gathered` unshards every FSDP unit for the rollout (one all-gather per unit) and
  reshards them after; the units' FSDP forward hooks are off meanwhile, so the model decodes as plain
  modules (no reshard after each layer's forward, nothing recorded for the backward's prefetch order).
  Both engines decode exactly as on one process; each rank decodes alone (no collective per step).
- **Training forward**: it runs as the forward of the FSDP root (:func:`tarpo.training.distributed.forward_through`),
  whose pre-forward gathers the root's own parameters (router, gate); :func:`gather_direct_reads` then
  unshards the embedding and head units; the decoder layers gather and free their parameters in their
  own forward and backward, as FSDP does for any model. The backward reduce-scatters the LoRA, router and
  gate gradients (FSDP's final backward callback reshards the units the forward read directly).
- **Precision**: no FSDP mixed-precision cast (:func:`prepare`): the base weights are already 16-bit, LoRA,
  router and gate stay fp32, and the trainer's own autocast (:mod:`tarpo.engine.precision`) computes as on
  one process.
- **Checkpoints**: :func:`whole_state_dict` gathers a module's full tensors (every rank calls it), and
  :func:`load_whole` puts full tensors back into sharded parameters.

Only FSDP2 is supported (:func:`check_sharding`): FSDP1 and DeepSpeed ZeRO-3 are refused.
"""

from __future__ import annotations

import contextlib

import torch


def check_sharding(accelerator) -> bool:
    """True under FSDP2; False for one process, DDP or ZeRO 1-2; FSDP1 and ZeRO-3 refused."""
    fsdp = getattr(accelerator.state, "fsdp_plugin", None)
    deepspeed = getattr(accelerator.state, "deepspeed_plugin", None)
    if deepspeed is not None and deepspeed.zero_stage == 3:
        raise ValueError("TarpoTrainer shards parameters with FSDP2 only, not DeepSpeed ZeRO-3: use an accelerate "
                         "config with distributed_type: FSDP and fsdp_version: 2 (configs/fsdp2.yaml; "
                         "docs/several-gpus.md)")
    if fsdp is not None and getattr(fsdp, "fsdp_version", 1) != 2:
        raise ValueError("TarpoTrainer shards parameters with FSDP2 only: set fsdp_version: 2 in the accelerate "
                         "config (configs/fsdp2.yaml; docs/several-gpus.md)")
    return fsdp is not None


def prepare(accelerator, trained: list[torch.nn.Parameter]) -> None:
    """Before accelerate shards the model (its ``prepare``, at the start of ``train``): no mixed-precision
    cast of FSDP's, and rank 0's trained parameters on every rank (each rank drew its own LoRA and router:
    TRL seeds each rank differently, and FSDP2 keeps each rank's own shard of what it holds)."""
    accelerator.state.fsdp_plugin.mixed_precision_policy = None
    from .distributed import same_on_every_rank
    with torch.no_grad():
        holder = torch.nn.ParameterList(trained)
        same_on_every_rank(holder)


def units(model: torch.nn.Module) -> list:
    """The FSDP2 units of ``model`` (root first); empty when it is not sharded."""
    from torch.distributed.fsdp import FSDPModule
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _is_fsdp_hook(hook) -> bool:
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    return isinstance(getattr(hook, "__self__", None), FSDPState)


@contextlib.contextmanager
def _fsdp_hooks_off(modules):
    """FSDP's forward hooks of ``modules`` removed for the duration, put back in their order after."""
    saved = []
    for m in modules:
        for hooks in (m._forward_pre_hooks, m._forward_hooks):
            saved.append((hooks, list(hooks.items())))
            for key in [k for k, h in hooks.items() if _is_fsdp_hook(h)]:
                del hooks[key]
    try:
        yield
    finally:
        for hooks, items in saved:
            hooks.clear()
            hooks.update(items)


@contextlib.contextmanager
def gathered(model: torch.nn.Module):
    """Every parameter of ``model`` whole on this rank for the duration (all ranks enter together), its FSDP
    forward hooks off; nothing happens for a model that is not sharded.

    Memory: the whole model's weights in their own dtype (bf16 base, fp32 LoRA), as on one process, for
    the rollout only; the plan counts it (:mod:`tarpo.engine.memory_plan`, ``Run.shards``)."""
    found = units(model)
    if not found:
        yield
        return
    with _fsdp_hooks_off(found):
        for unit in found:
            unit.unshard()
        try:
            yield
        finally:
            for unit in found:
                unit.reshard()


def gather_direct_reads(model: torch.nn.Module) -> None:
    """Inside the training forward of a sharded model: unshard the units the scoring reads directly (the
    root, the input embedding's and the output head's). FSDP's final backward callback reshards them and
    reduce-scatters their gradients."""
    found = units(model)
    if not found:
        return
    direct = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
    for unit in found:
        if unit is found[0] or id(unit) in direct:
            unit.unshard()


def whole_state_dict(module: torch.nn.Module, keep=lambda name: True) -> dict[str, torch.Tensor]:
    """``module.state_dict()``'s entries whose name ``keep`` accepts, every sharded tensor gathered whole
    (all ranks call it together; only the kept ones are gathered)."""
    from torch.distributed.tensor import DTensor
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach()
            for k, v in module.state_dict().items() if keep(k)}


@torch.no_grad()
def load_whole(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load full tensors ``state`` into ``module``, whose parameters may be sharded (all ranks call it with
    the same ``state``)."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    own = module.state_dict()
    if own.keys() != state.keys():
        raise ValueError(f"{type(module).__name__}: the saved tensors {sorted(state)} are not {sorted(own)}")
    for name, target in own.items():
        value = state[name].to(target.dtype)
        if isinstance(target, DTensor):
            target.copy_(distribute_tensor(value.to(target.device), target.device_mesh, target.placements))
        else:
            target.copy_(value.to(target.device))
