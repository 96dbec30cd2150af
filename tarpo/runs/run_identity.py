"""What a run folder is: the model, the data and every setting that changes shapes, the objective or the data
order, recorded in ``<run folder>/run_identity.json`` when training starts, and checked at every launch into
that folder before anything loads (docs/design-notes.md, "A run folder knows what it is").

A launch whose identity differs from the folder's is refused, naming each difference and the two ways out
(another RUN_NAME/OUT_DIR for a new run, or the folder's settings to resume it); a folder that holds training
files but no record (a run of an earlier version) is refused too. What may change between launches of one run
(:data:`MAY_CHANGE`): how long it trains and how often it saves, where it reports, how a step is split into
micro-batches and processes, the rollout engine and its decode weights, the backend, gradient checkpointing, the
signals that stop it, its non-finite guard and timings, evaluation settings.

    >>> print(differences({"LORA_R": 4, "SEED": 0}, {"LORA_R": 8, "SEED": 0})[0])
    LORA_R=8 (the run folder's: 4)
"""

from __future__ import annotations

import hashlib
import json
import os

from ..atomic_files import write_json_atomic
from ..models.gguf import digest, is_gguf
from ..models.offline import local_copy, source_record
from .launch_config import LaunchConfig
from .launch_variables import variable_of
from .presets import MODELS

IDENTITY_FILE = "run_identity.json"
WEIGHTS = "MODEL weights"  # a preset's: where they load from (preset_weights)
# TarpoConfig fields a run may change from one launch to the next (none changes what is trained on, nor how)
MAY_CHANGE = frozenset({
    "max_steps", "num_train_epochs", "save_steps", "report_to", "logging_steps", "output_dir", "rollout_engine",
    "per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
    "decode_merge", "save_on_signals", "max_nonfinite_steps", "time_scoring",
})
# a folder holding any of these has trained
TRAINING_FILES = ("adapter", "metrics.jsonl")


def file_digest(path: str) -> str:
    """sha256 of a file, or of a folder's files (relative names and bytes, in sorted order)."""
    h = hashlib.sha256()
    if os.path.isfile(path):
        files = [(os.path.basename(path), path)]
    else:
        files = sorted((os.path.relpath(os.path.join(d, f), path), os.path.join(d, f))
                       for d, _, names in os.walk(path) for f in names)
    for name, full in files:
        h.update(name.encode() + b"\0")
        with open(full, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def model_digest(model: str) -> str | None:
    """A local model folder's config.json bytes and its files' names and sizes (weights are not read: gigabytes);
    a GGUF file's bytes (:func:`tarpo.models.gguf.digest`); None for a hub id (the id names it)."""
    if os.path.isfile(model) and is_gguf(model):
        return digest(model)
    if not os.path.isdir(model):
        return None
    h = hashlib.sha256()
    with open(os.path.join(model, "config.json"), "rb") as f:
        h.update(f.read())
    for name in sorted(os.listdir(model)):
        full = os.path.join(model, name)
        if os.path.isfile(full):
            h.update(f"{name}\0{os.path.getsize(full)}\0".encode())
    return h.hexdigest()


def identity(cfg: LaunchConfig) -> dict:
    """The run's identity, of the configuration as :func:`tarpo.runs.presets.resolve` returns it (before the
    device and the memory plan change it): launcher names where a variable sets the value, TarpoConfig's
    names elsewhere."""
    # a preset is named by its hub id, and its weights by where they load from: the hub, or the folder
    # tarpo.models.offline made of a package's quantized file (close to the hub's weights, not equal to them)
    model = MODELS[cfg.preset]["hub_id"] if cfg.preset else (
        os.path.abspath(cfg.model) if os.path.exists(cfg.model) else cfg.model)
    out = {"MODEL": model, "MODEL (config and files)": None if cfg.preset else model_digest(cfg.model),
           **({WEIGHTS: preset_weights(cfg.preset)} if cfg.preset else {}),
           "dataset": cfg.dataset, "ALGO": cfg.algo,
           "DATA_PATH": os.path.abspath(cfg.data_path) if cfg.data_path else None,
           "DATA_PATH (contents)": file_digest(cfg.data_path) if cfg.data_path else None,
           "TRAIN_LIMIT": cfg.train_limit,
           "BATCH": cfg.trainer["per_device_train_batch_size"] * cfg.num_processes}  # resolve()'s: BATCH/processes
    for field, value in sorted(cfg.trainer.items()):
        if field not in MAY_CHANGE:
            out[variable_of(field) or field] = list(value) if isinstance(value, tuple) else value
    return json.loads(json.dumps(out))  # as the file holds it (tuples as lists)


def preset_weights(preset: str) -> str:
    """Where a preset's weights load from, as the identity names them: its offline copy (the package and the GGUF
    file's digest, :mod:`tarpo.models.offline`) or the hub."""
    if local_copy(preset) is not None:
        source = source_record(preset)
        return f"the offline copy of {source['package']} ({source['gguf']}, sha256 {source['gguf_sha256'][:16]})"
    return f"the hub's {MODELS[preset]['hub_id']}"


def differences(recorded: dict, now: dict) -> list[str]:
    """Each key whose value differs, as ``KEY=now (the run folder's: recorded)``; digests as ``KEY differ``."""
    return [f"{key} differ" if key.endswith(")") else f"{key}={now.get(key)} (the run folder's: {recorded.get(key)})"
            for key in sorted(recorded.keys() | now.keys()) if recorded.get(key) != now.get(key)]


def check(cfg: LaunchConfig, ident: dict) -> None:
    """Raise ``ValueError`` if ``cfg.run_dir`` was made by another run than ``ident`` (:func:`identity`), or by an
    earlier version (no record); reads the record and the data, before anything is loaded or written."""
    path = os.path.join(cfg.run_dir, IDENTITY_FILE)
    ways_out = ("set another RUN_NAME or OUT_DIR for a new run, or the same settings to resume it "
                "(docs/design-notes.md, \"A run folder knows what it is\")")
    if not os.path.isfile(path):
        trained = [n for n in TRAINING_FILES if os.path.exists(os.path.join(cfg.run_dir, n))]
        if trained:
            raise ValueError(f"OUT_DIR/RUN_NAME: the run folder {cfg.run_dir} holds {', '.join(trained)} but no "
                             f"{IDENTITY_FILE} (a run of an earlier version, or not a run): {ways_out}")
        return
    with open(path) as f:
        recorded = json.load(f)
    if WEIGHTS not in recorded:  # recorded before a preset's weights were told apart: not compared
        ident = {k: v for k, v in ident.items() if k != WEIGHTS}
    diff = differences(recorded, ident)
    if diff:
        raise ValueError(f"OUT_DIR/RUN_NAME: the run folder {cfg.run_dir} was made with other settings: "
                         f"{'; '.join(diff)}: {ways_out}")


def record(run_dir: str, ident: dict) -> None:
    """Write the run's identity into its folder when it has none (the first launch that trains)."""
    path = os.path.join(run_dir, IDENTITY_FILE)
    if not os.path.isfile(path):
        os.makedirs(run_dir, exist_ok=True)
        write_json_atomic(path, ident)
