"""The launcher's path variables checked before torch is imported (:func:`tarpo.runs.presets.resolve`): a local
``MODEL`` folder holds a model, ``OUT_DIR`` can be made and written. Each refusal is a ``ValueError`` naming the
variable and the path."""

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


def check_out_dir(out_dir: str) -> None:
    """OUT_DIR can be made and written: its nearest existing folder is a folder and writable."""
    path = os.path.abspath(out_dir)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise ValueError(f"OUT_DIR={out_dir}: {path} is a file, not a folder")
    if not os.access(path, os.W_OK):
        raise ValueError(f"OUT_DIR={out_dir}: {path} is not writable")
