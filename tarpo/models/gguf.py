"""A ``.gguf`` file as ``MODEL``: checked without torch, then converted once into a model folder.

transformers loads GGUF files itself (``from_pretrained(folder, gguf_file=name)``, with the ``gguf`` package),
dequantising every tensor; but a model loaded so carries a ``quantization_config`` (it cannot be saved, and the
project refuses quantized models: :mod:`tarpo.models.quantized`), and its tokenizer takes the wrong EOS for some
files (SmolLM2's: ``<|im_start|>``, where the file says id 2, ``<|im_end|>``). So the file is converted once,
through transformers' own GGUF path, into a plain fp32 folder in the cache (``runs/cache/gguf/<name>-<digest>``,
a digest of the file's bytes), with the special tokens the file's metadata names; every later step (the
launcher, ``tarpo eval``, ``tarpo case``, Unsloth) reads that folder like any other.

:func:`check_gguf` reads only the header (``gguf.GGUFReader``, no torch, nothing written) and refuses, in one
line naming the setting and the file: a file that is not GGUF or is cut short, an architecture the rollout
engine does not decode (it decodes Llama and Qwen2), a tensor type transformers cannot dequantise, and a file
without a chat template when the task's prompts are chat messages.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

CACHE_DIR = os.path.join("runs", "cache")  # the project's cache (the demo's warm start lives here too)
DECODED = ("llama", "qwen2")  # the rollout engine's (tarpo.engine.functional_decoder)
# the tensor types transformers dequantises (its GGUF documentation's list; gguf.quants does the work)
TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS", "IQ4_NL")
SPECIAL = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id", "unk": "unknown_token_id"}


def is_gguf(model: str) -> bool:
    return model.lower().endswith(".gguf")


def _field(reader, key):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def check_gguf(path: str, label: str, chat: bool = True) -> dict:
    """The file's facts (``architecture``, ``types``, ``chat_template``, the special token ids), or a
    ``ValueError`` beginning with ``label`` (e.g. ``MODEL=x.gguf``) saying what is wrong. Reads the header only."""
    if not os.path.isfile(path):
        raise ValueError(f"{label}: no such file")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ValueError(f"{label}: reading a GGUF file needs the gguf package (bash scripts/setup_env.sh installs "
                         "it; pip install gguf==0.19.0)") from None
    try:  # the reader maps every tensor: a file cut short fails here too (its last tensor cannot be shaped)
        reader = GGUFReader(path)
    except Exception as exc:  # noqa: BLE001  (gguf raises ValueError, KeyError, IndexError on a damaged file)
        raise ValueError(f"{label}: not a readable GGUF file, corrupt or cut short "
                         f"({type(exc).__name__}: {str(exc)[:120]})") from None
    architecture = _field(reader, "general.architecture")
    if architecture not in DECODED:
        raise ValueError(f"{label}: architecture {architecture!r}: TARPO's rollout decodes "
                         f"{' and '.join(DECODED)} models only")
    types = sorted({t.tensor_type.name for t in reader.tensors})
    unknown = [t for t in types if t not in TENSOR_TYPES]
    if unknown:
        raise ValueError(f"{label}: tensor type {', '.join(unknown)}, which transformers cannot dequantise "
                         f"(it reads {', '.join(TENSOR_TYPES)})")
    template = _field(reader, "tokenizer.chat_template")
    if chat and not template:
        raise ValueError(f"{label}: no chat template (tokenizer.chat_template) in the file, and the task's prompts "
                         "are chat messages")
    ids = {name: _field(reader, f"tokenizer.ggml.{key}") for name, key in SPECIAL.items()}
    return {"architecture": architecture, "types": types, "chat_template": template, **ids}


def digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()[:16]


def cache_folder(path: str, cache_dir: str) -> str:
    """Where :func:`gguf_folder` puts the converted model of ``path``."""
    name = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(cache_dir, "gguf", f"{name}-{digest(path)}")


def gguf_folder(path: str, cache_dir: str = CACHE_DIR, label: str = "MODEL") -> str:
    """The model folder converted from the GGUF file ``path`` (made on first use, a few seconds to a minute, after
    :func:`check_gguf` has read the facts it needs; a folder already made is returned without reading the file's
    header again). Written under a temporary name and renamed when complete."""
    final = cache_folder(path, cache_dir)
    if not os.path.isfile(os.path.join(final, "config.json")):
        write_folder(path, check_gguf(path, f"{label}={path}", chat=False), final)
    return final


def write_folder(path: str, facts: dict, final: str, records: dict | None = None) -> None:
    """:func:`convert` into a temporary folder beside ``final``, with ``records`` (file name -> JSON) beside the
    model, renamed to ``final`` once complete."""
    import json

    from ..atomic_files import publish_folder

    os.makedirs(os.path.dirname(os.path.abspath(final)), exist_ok=True)
    staged = tempfile.mkdtemp(prefix=".partial-", dir=os.path.dirname(os.path.abspath(final)))
    try:
        convert(path, facts, staged)
        for name, record in (records or {}).items():
            with open(os.path.join(staged, name), "w") as f:
                json.dump(record, f, indent=1)
        publish_folder(staged, final)
    except (OSError, KeyError, RuntimeError, NotImplementedError) as exc:  # transformers' GGUF reading
        raise ValueError(f"{path}: the conversion through transformers failed ({type(exc).__name__}: "
                         f"{str(exc)[:160]})") from None
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def convert(path: str, facts: dict, out: str) -> None:
    """transformers' GGUF loading (dequantised to fp32), saved as a plain folder: the ``quantization_config`` it
    adds dropped (the weights are plain tensors now), the tokenizer's special tokens set to the file's ids."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    for key in SPECIAL:
        if facts.get(key) is not None:
            setattr(tokenizer, f"{key}_token", tokenizer.convert_ids_to_tokens(int(facts[key])))
    if facts.get("chat_template"):
        tokenizer.chat_template = facts["chat_template"]
    tokenizer.clean_up_tokenization_spaces = False  # a BPE tokenizer's (transformers warns otherwise)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    for key in ("eos", "pad", "bos"):
        if facts.get(key) is not None:
            setattr(model.config, f"{key}_token_id", int(facts[key]))
            setattr(model.generation_config, f"{key}_token_id", int(facts[key]))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
