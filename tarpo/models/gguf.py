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
engine does not decode (it decodes Llama and Qwen2), a tensor type the installed ``gguf`` package cannot dequantise
(transformers dequantises every tensor through ``gguf.quants.dequantize``; :func:`dequantisable` asks it), and a
file without a chat template when the task's prompts are chat messages.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import tempfile

# where converted models (and the offline copies of tarpo.models.offline) are kept: runs/cache under the working
# folder, or TARPO_CACHE_DIR
CACHE_DIR = os.environ.get("TARPO_CACHE_DIR") or os.path.join("runs", "cache")
DECODED = ("llama", "qwen2")  # the rollout engine's (tarpo.engine.functional_decoder)
SPECIAL = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id", "unk": "unknown_token_id"}


@functools.cache
def dequantisable(type_name: str) -> bool:
    """Whether the installed ``gguf`` package dequantises tensors of ``type_name`` (one block of zeros, tried).

    >>> dequantisable("Q4_1"), dequantisable("TQ1_0"), dequantisable("Q8_1")
    (True, True, False)
    """
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        kind = GGMLQuantizationType[type_name]
        dequantize(np.zeros((1, GGML_QUANT_SIZES[kind][1]), np.uint8), kind)
    except (KeyError, NotImplementedError, ValueError, TypeError):
        return False
    return True


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
    unknown = [t for t in types if not dequantisable(t)]
    if unknown:
        from importlib.metadata import version
        raise ValueError(f"{label}: tensor type {', '.join(unknown)}, which the installed gguf package "
                         f"({version('gguf')}) cannot dequantise")
    template = _field(reader, "tokenizer.chat_template")
    if chat and not template:
        raise ValueError(f"{label}: no chat template (tokenizer.chat_template) in the file, and the task's prompts "
                         "are chat messages")
    ids = {name: _field(reader, f"tokenizer.ggml.{key}") for name, key in SPECIAL.items()}
    return {"architecture": architecture, "types": types, "chat_template": template, **ids}


def file_sha256(path: str) -> str:
    """The sha256 of a file's bytes (hex), read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def digest(path: str, cache_dir: str = CACHE_DIR) -> str:
    """The first 16 hex digits of the sha256 of a file's bytes: read once per file, as long as its size and
    modification time stay the same (remembered in this process and in ``<cache_dir>/gguf/digests/``, so that the
    processes of one launch and the launches after it do not read a multi-gigabyte file again)."""
    st = os.stat(path)
    return _digest(os.path.abspath(path), st.st_size, st.st_mtime_ns, cache_dir)


@functools.cache
def _digest(path: str, size: int, mtime_ns: int, cache_dir: str) -> str:
    import json

    memo = os.path.join(cache_dir, "gguf", "digests", hashlib.sha256(path.encode()).hexdigest()[:16] + ".json")
    key = {"path": path, "size": size, "mtime_ns": mtime_ns}
    try:
        with open(memo) as f:
            known = json.load(f)
        if {k: known.get(k) for k in key} == key:
            return known["digest"]
    except (OSError, ValueError, AttributeError):
        pass
    value = file_sha256(path)[:16]
    try:
        from ..atomic_files import write_json_atomic
        write_json_atomic(memo, {**key, "digest": value})
    except OSError:  # a cache that cannot be written: the digest is still right, only read again next time
        pass
    return value


@contextlib.contextmanager
def conversion_lock(final: str, label: str):
    """Hold ``<final>.lock`` (``flock``): one conversion into ``final`` at a time, among the processes of a launch and
    the launches sharing the file system; the others wait, then find the folder made. A folder that cannot be made
    is refused naming it and ``TARPO_CACHE_DIR``."""
    import fcntl

    parent = os.path.dirname(os.path.abspath(final))
    try:
        os.makedirs(parent, exist_ok=True)
        lock = open(final + ".lock", "a")
    except OSError as exc:
        raise ValueError(f"{label}: the converted model's folder {parent} cannot be written ({exc.strerror or exc}); "
                         "set TARPO_CACHE_DIR to a folder you can write (default: runs/cache under the working "
                         "folder)") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def cache_folder(path: str, cache_dir: str) -> str:
    """Where :func:`gguf_folder` puts the converted model of ``path``."""
    name = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(cache_dir, "gguf", f"{name}-{digest(path, cache_dir)}")


def gguf_folder(path: str, cache_dir: str = CACHE_DIR, label: str = "MODEL") -> str:
    """The model folder converted from the GGUF file ``path`` (made on first use, a few seconds to a minute, after
    :func:`check_gguf` has read the facts it needs; a folder already made is returned without reading the file's
    header again). Written under a temporary name and renamed when complete."""
    final = cache_folder(path, cache_dir)
    if not os.path.isfile(os.path.join(final, "config.json")):
        with conversion_lock(final, f"{label}={path}"):
            if not os.path.isfile(os.path.join(final, "config.json")):  # not made while this process waited
                with parsed_once():
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
    with parsed_once():
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


@contextlib.contextmanager
def parsed_once():
    """While active, ``gguf.GGUFReader`` returns one reader per file: transformers parses a GGUF file anew for each
    of its loads (the tokenizer, the config, the weights), about 2.5 s each for SmolLM2-135M (its 49k-token
    vocabulary; 2-core AMD EPYC), and :func:`check_gguf` once more before. A reader only reads its file (a read-only
    memory map), so one serves them all."""
    import gguf

    original, readers = gguf.GGUFReader, {}
    if getattr(original, "shares_readers", False):  # inside another: its readers serve
        yield
        return

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    reader.shares_readers = True
    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original
