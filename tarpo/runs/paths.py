"""The launcher's path variables checked before torch is imported (:func:`tarpo.runs.presets.resolve`): ``MODEL`` is a
preset, a hub id, a local folder that holds a model, or a GGUF file whose header TARPO can use
(:func:`tarpo.models.gguf.check_gguf`), and no quantized model (:func:`tarpo.models.quantized.check_not_quantized`;
``OUT_DIR``: :func:`tarpo.atomic_files.check_writable_folder`, as ``tarpo eval --out`` is). Each refusal is a
``ValueError`` naming the variable and the path."""

from __future__ import annotations

import os

from ..models.gguf import check_gguf, is_gguf
from ..models.offline import local_copy, stale_copy
from ..models.quantized import check_not_quantized


def looks_like_path(name: str) -> bool:
    """A local path rather than a hub id (``org/name``).

    >>> [looks_like_path(x) for x in ("Qwen/Qwen2.5-3B-Instruct", "/models/q", "./q", "~/q", "a/b/c", "q")]
    [False, True, True, True, True, False]
    """
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def model_source(model_key: str, preset: dict | None) -> str:
    """What MODEL loads: a preset's folder made by ``python -m tarpo.models.offline`` if there is one, else its hub
    id; otherwise MODEL itself (a hub id, a folder or a ``.gguf`` file)."""
    if preset is None:
        return model_key
    return local_copy(model_key.lower()) or preset["hub_id"]


def check_model(model_key: str, preset: dict | None, presets) -> None:
    """MODEL names a preset (of ``presets``), a hub id, a model folder or a usable GGUF file, and no quantized
    model. A GGUF file is converted into a folder only once the whole run is checked (:mod:`tarpo.runs.launch`)."""
    stale = preset is not None and stale_copy(model_key.lower())
    if stale:  # silently loading the hub's weights instead would change the run's weights (or fail offline)
        raise ValueError(f"MODEL={model_key}: {stale} was made from another pin or by an earlier version: run "
                         f"python -m tarpo.models.offline {model_key.lower()} again (or remove the folder to load "
                         "the hub's weights)")
    if preset is None and is_gguf(model_key):
        check_gguf(model_key, f"MODEL={model_key}")
        return
    if preset is None and not os.path.isdir(model_key):
        if looks_like_path(model_key):
            raise ValueError(f"MODEL={model_key!r}: no such folder")
        if "/" not in model_key:
            raise ValueError(f"MODEL={model_key!r}: not a preset ({', '.join(presets)}), a hub id or a local folder")
    check_model_folder(model_key, preset)
    check_not_quantized(model_source(model_key, preset), f"MODEL={model_key!r}")


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

