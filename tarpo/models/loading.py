"""Loading the policy: a causal LM (hub id or local path), its LoRA adapter and the router.

Two backends (``BACKEND`` / ``backend=``): ``hf``, transformers + PEFT, runs anywhere (CPU
included); ``unsloth``, Unsloth's ``FastLanguageModel`` with ``tarpo.patches`` applied,
needs CUDA and Unsloth (``scripts/install_gpu.sh``). ``auto`` picks Unsloth when both are present.
"""

from __future__ import annotations

import importlib.util
import os

import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..engine.router import ROUTER_WEIGHTS, Router

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_tokenizer(name_or_path: str):
    """The tokenizer, padding on the left; one without a pad token pads with its EOS token (padding is
    masked everywhere, so the choice never reaches a loss)."""
    tok = AutoTokenizer.from_pretrained(name_or_path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"{name_or_path}: the tokenizer has neither a pad nor an EOS token")
        tok.pad_token = tok.eos_token
    return tok


def stop_token_ids(model, tokenizer) -> list[int]:
    """The ids that end a completion, in training and evaluation alike: the tokenizer's EOS and every
    EOS of the model's ``generation_config.json`` and ``config.json``. Instruct models often disagree
    (Qwen2.5: ``<|im_end|>`` in the tokenizer, ``<|endoftext|>`` in config.json, both in the generation
    config); ``generate()`` stops on the generation config's, TRL's GRPOTrainer on those plus the
    tokenizer's, and a row that wrote any of them has ended.

    >>> from types import SimpleNamespace as NS
    >>> model = NS(generation_config=NS(eos_token_id=[7, 3]), config=NS(eos_token_id=3))
    >>> stop_token_ids(model, NS(eos_token_id=5))
    [5, 7, 3]
    """
    ids = [tokenizer.eos_token_id]
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(source, "eos_token_id", None)
        ids += [eos] if isinstance(eos, int) else list(eos or [])
    return list(dict.fromkeys(i for i in ids if i is not None))


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
    """A router initialised as docs/algorithm.md §1 says, on the model's device, in fp32."""
    router = Router(model.config.hidden_size, bias=config.action_bias, init_std=config.router_init_std,
                    temperature=config.action_temperature)
    return router.to(next(model.parameters()).device)


BACKENDS = ("auto", "hf", "unsloth")


def resolve_backend(backend: str = "auto") -> str:
    """``hf`` or ``unsloth``; ``auto`` is Unsloth when CUDA and the ``unsloth`` package are present."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: must be one of {', '.join(BACKENDS)}")
    available = torch.cuda.is_available() and importlib.util.find_spec("unsloth") is not None
    if backend == "unsloth" and not available:
        raise ValueError("backend=unsloth needs CUDA and Unsloth (bash scripts/install_gpu.sh, docs/gpu-install.md)")
    return "unsloth" if backend == "unsloth" or (backend == "auto" and available) else "hf"


def load_unsloth(name_or_path: str, max_seq_length: int, dtype: str = "bfloat16", seed: int = 0):
    """A base model through Unsloth's ``FastLanguageModel`` (16-bit weights, embeddings kept on
    the GPU for the soft mixtures). ``tarpo.patches`` are applied by :func:`unsloth_policy` /
    :func:`load_trained` once the adapter is in place."""
    from ..patches import check_versions
    check_versions()
    from unsloth import FastLanguageModel  # after tarpo.training.trainer: see tarpo.patches.trl_guard
    # use_exact_model_name: Unsloth otherwise maps a hub id to its own copy (Qwen/Qwen2.5-3B-Instruct ->
    # unsloth/Qwen2.5-3B-Instruct), which an offline cache of the user's model misses
    model, _ = FastLanguageModel.from_pretrained(model_name=name_or_path, max_seq_length=max_seq_length,
                                                 dtype=DTYPES[dtype], load_in_4bit=False, offload_embedding=False,
                                                 random_state=seed, use_exact_model_name=True)
    return model


def unsloth_policy(name_or_path: str, config, dtype: str = "bfloat16"):
    """The training policy on Unsloth: base model + ``FastLanguageModel.get_peft_model`` with the
    config's LoRA (Unsloth gradient checkpointing), patched for TARPO."""
    from unsloth import FastLanguageModel

    from .. import patches
    model = load_unsloth(name_or_path, config.max_prompt_length + config.max_completion_length, dtype, config.seed)
    model = FastLanguageModel.get_peft_model(
        model, r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_target_modules), random_state=config.seed,
        use_gradient_checkpointing="unsloth" if config.gradient_checkpointing else False)
    patches.apply(model)
    return model


def training_policy(name_or_path: str, config, backend: str = "auto", dtype: str = "bfloat16"):
    """The model :class:`tarpo.training.trainer.TarpoTrainer` trains, as the launchers build it.

    Unsloth: :func:`unsloth_policy` (LoRA, Unsloth's gradient checkpointing, ``tarpo.patches``);
    ``config.gradient_checkpointing`` is then set False, as Unsloth's own checkpointing is on and
    the Trainer must not add transformers'. transformers: the base model, on CUDA when there is
    one; the trainer adds the LoRA adapter of ``config``.
    """
    if resolve_backend(backend) == "unsloth":
        model = unsloth_policy(name_or_path, config, dtype)
        config.gradient_checkpointing = False
        return model
    return load_base_model(name_or_path, dtype, "cuda" if torch.cuda.is_available() else None)


def load_trained(base: str, adapter: str | None = None, dtype: str = "bfloat16", device=None, backend: str = "hf",
                 max_seq_length: int = 4096):
    """Base model + optional saved adapter folder (holding ``router.safetensors`` beside it).

    Returns ``(model, router_or_None, tokenizer)``.
    """
    unsloth = resolve_backend(backend) == "unsloth"
    model = load_unsloth(base, max_seq_length, dtype) if unsloth else load_base_model(base, dtype, device)
    router = None
    if adapter:
        model = PeftModel.from_pretrained(model, adapter)
        if os.path.exists(os.path.join(adapter, ROUTER_WEIGHTS)):
            router = Router.load(adapter, device=next(model.parameters()).device)
    if unsloth:
        from .. import patches
        patches.apply(model)  # after the adapter: the patches read the final (PEFT) model
    return model, router, load_tokenizer(base)
