"""Gradient checkpointing around a rollout.

A checkpointed layer in training mode refuses the decode's KV cache, so the trainer pauses checkpointing
while it rolls out (:func:`checkpointing_paused`).
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def checkpointing_paused(model: torch.nn.Module):
    """Gradient checkpointing off for the rollout (a checkpointed layer in training mode refuses the
    decode's cache), then every module's flag put back as it was; nothing else is touched.

    Not TRL's ``disable_gradient_checkpointing``: its ``gradient_checkpointing_enable`` on exit re-binds
    the layers' checkpoint function (replacing Unsloth's choice) and calls ``enable_input_require_grads``,
    which adds a forward hook on the input embedding at every rollout (never removed for a PEFT-wrapped
    model), so every later call of the embedding, each decode step included, ran one more hook per step.

        >>> layer = torch.nn.Linear(1, 1); layer.gradient_checkpointing = "unsloth"
        >>> with checkpointing_paused(layer):
        ...     layer.gradient_checkpointing
        False
        >>> layer.gradient_checkpointing
        'unsloth'
    """
    paused = [(m, m.gradient_checkpointing) for m in model.modules() if getattr(m, "gradient_checkpointing", False)]
    for module, _ in paused:
        module.gradient_checkpointing = False
    try:
        yield
    finally:
        for module, value in paused:
            module.gradient_checkpointing = value
