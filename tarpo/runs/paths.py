"""The launcher's path variables checked before torch is imported (:func:`tarpo.runs.presets.resolve`): a local
``MODEL`` folder holds a model (that it is no quantized one: :func:`tarpo.models.quantized.check_not_quantized`;
``OUT_DIR``: :func:`tarpo.atomic_files.check_writable_folder`, as ``tarpo eval --out`` is). Each refusal is a
``ValueError`` naming the variable and the path."""

from __future__ import annotations

import os


def check_model_folder(model_key: str, preset) -> None:
    """A local MODEL folder holds a model: a config, a tokenizer and weights (else loading it fails with
    another library's words, e.g. a slow-tokenizer conversion that needs sentencepiece)."""
    if preset is not None or not os.path.isdir(model_key):
        return
    names = set(os.listdir(model_key))
    if "config.json" not in names:
        raise ValueError(f"MODEL={model_key!r}: no config.json: not a model folder")
    if not names & {"tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model"}:
        raise ValueError(f"MODEL={model_key!r}: no tokenizer (tokenizer.json, tokenizer.model or vocab.json)")
    if not any(n.endswith((".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")) for n in names):
        raise ValueError(f"MODEL={model_key!r}: no weights (*.safetensors or *.bin)")

