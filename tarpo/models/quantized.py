"""A pre-quantized checkpoint is refused before it loads (docs/gpu-path.md, "Quantized models").

Such a model (a ``quantization_config`` in its config: bitsandbytes' 4-bit, GPTQ, AWQ, ...) loads quantized
whatever the launcher asks (Unsloth's ``from_pretrained`` reads the config and turns ``load_in_4bit`` on), and
the rollout's functional decoder reads the weights as plain tensors (packed ``Params4bit`` into ``F.linear``: a
shape error at the prefill). No torch here: the launcher checks ``MODEL`` before torch is imported.

    >>> check_not_quantized("Qwen/Qwen2.5-3B-Instruct", "MODEL")
    >>> try:
    ...     check_not_quantized("unsloth/Qwen2.5-3B-Instruct-bnb-4bit", "MODEL")
    ... except ValueError as e:
    ...     print(str(e)[:40])
    MODEL: a quantized model (bnb-4bit); TAR
"""

from __future__ import annotations

import json
import os
import re

# hub ids of pre-quantized checkpoints, by the names their makers give them (unsloth/...-bnb-4bit, ...-GPTQ-Int4)
QUANTIZED_NAME = re.compile(r"bnb-?[48]bit|[-_][48]bit\b|gptq|awq|[-_]int[48]\b", re.IGNORECASE)


def check_not_quantized(model: str, label: str) -> None:
    """``model`` (a hub id or a folder; ``label`` names the setting in the refusal) is not a quantized
    checkpoint: its config has no ``quantization_config`` (a local folder's, or a hub id's in the local cache),
    and a hub id's name says none (``-bnb-4bit``, ``GPTQ``, ``AWQ``, ``-4bit``, ``-Int4``). Such a model loads
    quantized whatever the launcher asks, and the rollout reads the weights as plain tensors
    (docs/gpu-path.md, "Quantized models")."""
    config = os.path.join(model, "config.json") if os.path.isdir(model) else _cached_config(model)
    method = None
    if config is not None and os.path.isfile(config):
        try:
            with open(config, encoding="utf-8") as f:
                settings = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{label}: {config} cannot be read as a model config ({e})") from None
        quantization = settings.get("quantization_config") if isinstance(settings, dict) else None
        if quantization:
            method = quantization.get("quant_method", "quantization_config") if isinstance(quantization, dict) \
                else "quantization_config"
    elif not os.path.isdir(model) and (named := QUANTIZED_NAME.search(model)):
        method = named.group(0).strip("-_")
    if method is not None:
        raise ValueError(f"{label}: a quantized model ({method}); TARPO trains LoRA over 16-bit weights "
                         "and rolls out over them: give the 16-bit model it was made from (docs/gpu-path.md, "
                         "\"Quantized models\")")


def _cached_config(hub_id: str) -> str | None:
    """The config.json of ``hub_id`` in the local Hugging Face cache, without any download; None if absent."""
    try:
        from huggingface_hub import try_to_load_from_cache
        found = try_to_load_from_cache(hub_id, "config.json")
    except Exception:  # noqa: BLE001  (an id the hub library does not take: the name check decides)
        return None
    return found if isinstance(found, str) else None

