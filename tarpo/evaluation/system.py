"""The system an inference mode evaluates: the base model, its adapter, and the trained router and
soft input (HRPO's gate) the mode reads (docs/algorithm.md §3, §7), with the routing settings its run was trained
with (:data:`tarpo.algorithms.RULE_SETTINGS` beside the adapter). ``tarpo eval``, ``tarpo case`` and the demo check
and load it the same way, and build their rollout settings with one constructor (:func:`rollout_spec`)."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from typing import Mapping, NamedTuple

import torch

from ..algorithms import MODES, RULE_SETTINGS
from ..config import default
from ..engine.rollout import Policy, RolloutSpec
from ..engine.router import ROUTER_WEIGHTS
from ..engine.soft_input import soft_input_class
from ..engine.tagging import token_text_fn
from ..models.backends import make_backbone
from ..models.loading import load_trained, stop_token_ids

SPEC_FIELDS = {f.name for f in fields(RolloutSpec)}
# the settings of an inference mode's rule that decoding reads (mode entropy's threshold, temperature and side): a
# trained run's, saved beside its adapter, unless a flag of tarpo eval / tarpo case sets them
RUN_FLAGS = tuple(sorted({name for m in MODES.values() for name in m.rule.settings} & SPEC_FIELDS))


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


def run_settings(adapter: str | None) -> dict:
    """The routing settings the adapter's run was trained with (:data:`tarpo.algorithms.RULE_SETTINGS`; ``{}``
    without an adapter or where it has none: an adapter of an earlier tarpo). A file that is not a JSON object, or
    a value of another type than the TarpoConfig field's, is refused naming it."""
    path = os.path.join(adapter, RULE_SETTINGS) if adapter else None
    if path is None or not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: not a JSON object (the routing settings tarpo saves beside an adapter)")
    for name in RUN_FLAGS:
        value, kind = saved.get(name), type(default(name))
        if name in saved and not (isinstance(value, kind) or kind is float and type(value) is int):
            raise ValueError(f"{path}: {name}={value!r}: not a {kind.__name__}")
    if not isinstance(saved.get("chat_template_kwargs", {}), dict):
        raise ValueError(f"{path}: chat_template_kwargs={saved['chat_template_kwargs']!r}: not a JSON object")
    return saved


def fill_run_settings(args) -> None:
    """Set each of :data:`RUN_FLAGS` that ``args`` (tarpo eval's or tarpo case's flags) left unset (None) to the
    adapter's run's value, else to TarpoConfig's default; read before any model loads."""
    saved = run_settings(args.adapter)
    for name in RUN_FLAGS:
        if getattr(args, name) is None:
            setattr(args, name, saved.get(name, default(name)))


def rollout_spec(settings: Mapping) -> RolloutSpec:
    """The rollout settings of an evaluation from its settings (``tarpo eval``'s trajectory file, ``tarpo case``'s
    flags, the demo's): every key that is a :class:`tarpo.engine.rollout.RolloutSpec` field and not None (None:
    the field's default), ``router`` ``"argmax"`` as argmax routing. The inference mode then sets the routing
    (:func:`tarpo.evaluation.sample.spec_for_mode`).

        >>> spec = rollout_spec({"max_new_tokens": 8, "temperature": 0.7, "entropy_soft_when": None,
        ...                      "router": "argmax", "seed": 3})
        >>> spec.max_new_tokens, spec.temperature, spec.entropy_soft_when, spec.router_greedy
        (8, 0.7, 'high', True)
    """
    given = {name: value for name, value in settings.items() if name in SPEC_FIELDS and value is not None}
    if settings.get("router") == "argmax":
        given["router_greedy"] = True
    return RolloutSpec(**given)


class System(NamedTuple):
    """A loaded system as an inference mode samples it: passed whole to :func:`tarpo.evaluation.sample.sample`,
    which decodes with its :meth:`policy`."""

    model: torch.nn.Module
    router: object          # the trained router, where the mode reads one (else None)
    soft_input: object      # what a soft step feeds (tarpo.engine.soft_input): HRPO's trained gate, the top-k mixture
    tokenizer: object
    device: torch.device
    mode: str               # the inference mode (tarpo.algorithms.MODES)
    template_kwargs: dict | None = None  # the chat template's arguments the run trained with (chat_template_kwargs)

    def policy(self) -> Policy:
        """The rollout engine's :class:`tarpo.engine.step.Policy` of this system (its backbone made anew)."""
        return Policy(make_backbone(self.model), token_text_fn(self.tokenizer),
                      stop_token_ids(self.model, self.tokenizer), self.tokenizer.pad_token_id, self.router,
                      self.soft_input)


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
    return System(model, router if rule.router else None, soft_input, tokenizer, device, mode,
                  run_settings(adapter).get("chat_template_kwargs"))
