"""The system an inference mode evaluates: the base model, its adapter, and the trained router and
soft input (HRPO's gate) the mode reads (docs/algorithm.md §3, §7). ``tarpo eval`` and ``tarpo case`` check and
load it the same way."""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from ..engine.soft_input import soft_input_class
from ..engine.router import ROUTER_WEIGHTS
from ..models.loading import load_trained
from ..algorithms import MODES


def check_system(adapter: str | None, mode: str) -> None:
    """The adapter folder holds what the inference mode needs (checked before loading)."""
    if adapter is not None and not os.path.isfile(os.path.join(adapter, "adapter_config.json")):
        raise ValueError(f"--adapter {adapter}: no adapter_config.json there (not a saved adapter)")
    rule = MODES[mode].rule
    if rule.router and not (adapter and os.path.isfile(os.path.join(adapter, ROUTER_WEIGHTS))):
        raise ValueError(f"--mode {mode} needs a trained router: --adapter must hold {ROUTER_WEIGHTS}")
    weights = soft_input_class(rule.soft_input).weights_file
    if weights and not (adapter and os.path.isfile(os.path.join(adapter, weights))):
        raise ValueError(f"--mode {mode} needs a trained {rule.soft_input} (its soft input): --adapter must hold "
                         f"{weights}")


class System(NamedTuple):
    """A loaded system as an inference mode samples it (the evaluation's counterpart of the engine's
    :class:`tarpo.engine.step.Policy`): passed whole to :func:`tarpo.evaluation.sample.sample`."""

    model: torch.nn.Module
    router: object          # the trained router, where the mode reads one (else None)
    soft_input: object      # what a soft step feeds (tarpo.engine.soft_input): HRPO's trained gate, the top-k mixture
    tokenizer: object
    device: torch.device
    mode: str               # the inference mode (tarpo.algorithms.MODES)


def load_system(model_path: str, adapter: str | None, mode: str, dtype: str = "auto", action_temperature=None,
                backend: str = "hf", device=None) -> System:
    """The :class:`System` of an inference mode, on ``device`` (default CUDA when available); ``auto`` dtype =
    bfloat16 on CUDA, float32 on CPU."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype if dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    model, router, tokenizer = load_trained(model_path, adapter, dtype=dtype, device=device, backend=backend)
    model.eval()
    if router is not None and action_temperature is not None:
        router.temperature = action_temperature
    rule = MODES[mode].rule
    soft_input = soft_input_class(rule.soft_input).load(adapter, device)
    return System(model, router if rule.router else None, soft_input, tokenizer, device, mode)
