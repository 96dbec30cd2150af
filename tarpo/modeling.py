"""Loading the policy: a causal LM (hub id or local path), its LoRA adapter and the router.

This is the transformers + PEFT path; it runs anywhere (CPU included). Issue #7's
Unsloth path plugs in here when CUDA and the ``gpu`` extra are present.
"""

from __future__ import annotations

import os

import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from .latent import HRPO_WEIGHTS, HrpoGate
from .router import ROUTER_WEIGHTS, Router

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_tokenizer(name_or_path: str):
    tok = AutoTokenizer.from_pretrained(name_or_path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_base_model(name_or_path: str, dtype: str = "bfloat16", device=None):
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: must be one of {sorted(DTYPES)}")
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=DTYPES[dtype])
    return model.to(device) if device is not None else model


def lora_config(config) -> LoraConfig:
    """The LoRA adapter described by the ``lora_*`` fields of a :class:`TarpoConfig`."""
    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")


def new_router(model, config) -> Router:
    """A router initialised as DESIGN §1 says, on the model's device, in fp32."""
    router = Router(model.config.hidden_size, bias=config.action_bias, init_std=config.router_init_std,
                    temperature=config.action_temperature)
    return router.to(next(model.parameters()).device)


def load_trained(base: str, adapter: str | None = None, dtype: str = "bfloat16", device=None):
    """Base model + optional saved adapter folder (holding ``router.safetensors`` beside it).

    Returns ``(model, router_or_None, tokenizer)``.
    """
    model = load_base_model(base, dtype, device)
    router = None
    if adapter:
        model = PeftModel.from_pretrained(model, adapter)
        if os.path.exists(os.path.join(adapter, ROUTER_WEIGHTS)):
            router = Router.load(adapter, device=next(model.parameters()).device)
    return model, router, load_tokenizer(base)


def load_gate(adapter: str | None, device=None) -> HrpoGate | None:
    """HRPO's trained gate saved beside an adapter, or None if there is none."""
    if adapter and os.path.exists(os.path.join(adapter, HRPO_WEIGHTS)):
        return HrpoGate.load(adapter, device=device)
    return None
