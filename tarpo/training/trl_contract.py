"""What ``TarpoTrainer`` takes as TRL's ``GRPOTrainer`` takes it (docs/design-notes.md, "TRL's contract"): its
arguments where they are optional in TRL, streaming data sets, the parameters it cannot serve (refused, with why).

TRL's ``GRPOTrainer(model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, processing_class=None,
...)``: ``model`` a model, a hub id or a folder (TRL loads it), ``args`` None gives a default configuration named
after the model, ``processing_class`` None loads the model's tokenizer (TRL does both).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# GRPOTrainer's parameters this trainer cannot serve, and why (each refused naming itself when it is not None)
UNSERVED = {
    "tools": "tool calls inside a completion: the hybrid decode loop feeds each step's own input (hard or soft), "
             "not a tool's result",
    "rollout_func": "a custom rollout replaces generation, and the hybrid rollout is what this trainer trains",
    "environment_factory": "environments drive the rollout, which the hybrid decode loop owns",
}


def default_args(model):
    """TRL's default configuration (``<model name>-GRPO``), as a TarpoConfig: ``<model name>-TARPO``."""
    from ..config import TarpoConfig
    name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "") or "model"
    return TarpoConfig(output_dir=f"{str(name).rstrip('/').split('/')[-1]}-TARPO")


def refuse_unserved(**given) -> None:
    """Raise ``ValueError`` naming each parameter of :data:`UNSERVED` that is given, and why."""
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"TarpoTrainer({name}=...): not served: {UNSERVED[name]}")


def refuse_quantized(model, quantization_config, args) -> None:
    """A quantized model (a ``quantization_config`` given, in ``model_init_kwargs`` or in the model's config; a
    quantized checkpoint's name or folder) is refused in one line, before it loads: the rollout decodes the weights
    as plain 16-bit tensors (docs/gpu-path.md, "Quantized models"; the launchers refuse it the same way)."""
    from ..models.quantized import check_not_quantized
    given = quantization_config or (args.model_init_kwargs or {}).get("quantization_config")
    if isinstance(model, str) and given is None:
        return check_not_quantized(model, "TarpoTrainer(model=...)")
    config = getattr(model, "config", None)
    given = given or getattr(config, "quantization_config", None) or getattr(model, "is_quantized", False)
    if given:
        method = getattr(given, "quant_method", None) or (given.get("quant_method") if isinstance(given, dict)
                                                          else None) or "quantization_config"
        raise ValueError(f"TarpoTrainer: a quantized model ({method}); TARPO trains LoRA over 16-bit weights and "
                         "rolls out over them: give the 16-bit model (docs/gpu-path.md, \"Quantized models\")")


def refuse_tied_fp32_head(model, args) -> None:
    """``cast_lm_head_to_fp32`` on a model whose head is its input embedding (``tie_word_embeddings``) is refused
    before the weights load, as TRL's help supports it only untied: the cast would make the embedding fp32 too,
    which the rollout and the training forward read as the run's compute dtype (the autocast, the soft mixtures)."""
    if not args.cast_lm_head_to_fp32:
        return
    if isinstance(model, str):
        from transformers import AutoConfig
        config = AutoConfig.from_pretrained(model, trust_remote_code=args.trust_remote_code)
    else:
        config = model.config
    if getattr(config.get_text_config(), "tie_word_embeddings", False):
        raise ValueError("TarpoConfig.cast_lm_head_to_fp32=True: the model ties its head to its input embedding "
                         "(tie_word_embeddings); TRL supports the cast only untied, and here it would make the "
                         "embedding, which the rollout reads as the compute dtype, fp32 too: set it False")


def is_streaming(dataset) -> bool:
    """A ``datasets.IterableDataset`` (no length: TRL trains it for ``max_steps``)."""
    import datasets
    return isinstance(dataset, datasets.IterableDataset)


def check_dataset(dataset, name: str = "train_dataset") -> None:
    """Fail before any training if the data set is empty or has no ``prompt`` column (a streaming data set: its
    first row)."""
    if dataset is None:  # TRL 1.15 refuses it too, in these words, but for an environment_factory (not served here)
        raise ValueError(f"`{name}` is required (TarpoTrainer serves no `environment_factory`, TRL's one exception)")
    if is_streaming(dataset):
        first = next(iter(dataset), None)
        if first is None:
            raise ValueError(f"{name} is empty: no rows to train on")
        columns = list(first)
    else:
        if len(dataset) == 0:
            raise ValueError(f"{name} is empty: no rows to train on")
        columns = getattr(dataset, "column_names", None) or list(dataset[0].keys())
    if "prompt" not in columns:
        raise ValueError(f"{name} has no 'prompt' field (columns: {columns})")


def warn_too_long(tokenizer, dataset, args) -> None:
    """Say once, at the start of the run, how many training prompts are longer than ``max_prompt_length``
    (:mod:`tarpo.tasks.prompts`: their last user turn is cut from the left); a prompt that cannot fit is refused
    here. A streaming data set is not read ahead for it."""
    from ..tasks.prompts import count_too_long
    if is_streaming(dataset):
        return
    too_long = count_too_long(tokenizer, dataset["prompt"], args.max_prompt_length, args.chat_template_kwargs)
    if too_long:
        logger.warning(f"{too_long} of {len(dataset)} training prompts are longer than max_prompt_length="
                       f"{args.max_prompt_length} tokens: their last user turn is cut from the left (system prompt "
                       "and chat template kept)")
