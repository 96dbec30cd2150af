"""The arithmetic precision of rollouts and training forwards (docs/gpu-path.md, "Precision").

The base weights are 16-bit on a GPU (bfloat16 by default); the LoRA matrices, the router and HRPO's
gate are fp32 parameters, the optimizer's master copies. Every rollout and every training forward runs
under :func:`mixed_precision`, autocast to the weights' 16-bit dtype, as the Trainer's mixed precision
(accelerate's wrapper of ``model.forward``) and Unsloth's own ``generate`` run: the LoRA matmuls run in
that dtype like the base ones, on both backends and both engines, so the rollout's log-probs and the
training forward's come from the same arithmetic. The trainer calls the decoder directly (its training
forward replaces ``model.forward`` for DDP, :func:`tarpo.training.distributed.forward_through`), so it
enters the autocast itself, through this function.

The router and the gate are computed in fp32 inside it (:func:`full_precision`): they are tiny, and the
router's probabilities enter the loss as log-ratios. With fp32 weights (the CPU runs) there is no autocast.
"""

from __future__ import annotations

import torch

HALF = (torch.bfloat16, torch.float16)


def mixed_precision(backbone):
    """Autocast to the dtype of the backbone's weights where they are 16-bit; off for fp32 weights.

        >>> from types import SimpleNamespace as NS
        >>> with mixed_precision(NS(embed_weight=torch.zeros(1, dtype=torch.bfloat16))):
        ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
        torch.bfloat16
    """
    weight = backbone.embed_weight
    return torch.autocast(weight.device.type, dtype=weight.dtype, enabled=weight.dtype in HALF)


def full_precision(x: torch.Tensor):
    """No autocast inside (for the fp32 router and gate), on ``x``'s device."""
    return torch.autocast(x.device.type, enabled=False)
