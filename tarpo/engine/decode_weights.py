"""Which decode weights a compiled rollout uses, and how often they are built (``TarpoConfig.decode_merge``;
docs/rollout-engines.md, "Decode weights").

The compiled engine decodes with :func:`tarpo.engine.decoder_tensors.build` at a merge level: ``all``
(every adapter merged into a copy of the block that carries it), ``attention`` (the attention block's only) or
``none`` (the LoRA applied as an adapter, no copy). A block without LoRA is never copied. On an H100 the merge saves
about 1 ms of the 3B's 5-7 ms decode step at batch 64 for each block that carries LoRA (docs/gpu/2026-11-28-*.md).

- **The level.** A run the launcher planned has its level chosen by the memory plan
  (:func:`tarpo.engine.memory_plan.choose_decode_merge`). Without a plan (``auto`` reaching the engine: a
  ``TarpoTrainer`` user's run, ``tarpo eval``) :func:`merge_level` takes the first level at which the plan's own
  estimate of the rollout (:mod:`tarpo.engine.memory_plan`: the copies, the KV cache, the prefill's or a decode
  step's temporaries, the records) fits in this process's share of the memory free at the model's first compiled
  rollout, and keeps that level for the model (one compiled graph); a trainer keeps it for the run's whole life
  (:mod:`tarpo.training.decode_level`).
- **Built once per evaluation.** Within :func:`weights_held` the weights of a model are built at its first rollout
  and reused: evaluation's chunks all decode the same adapter. Training builds them every rollout (the adapter
  changes every optimizer step).
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref

import torch

from ..engineering_fields import DECODE_MERGES
from . import decoder_tensors, functional_decoder, memory_plan
from .backbone import unwrap

logger = logging.getLogger(__name__)

LEVELS = DECODE_MERGES[1:]  # all, attention, none: the most copies first (TarpoConfig.decode_merge without auto)
_chosen: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()  # model -> (auto's
#                                                                                      level, the cache it allowed)
_held: dict | None = None  # while weights_held(): id(model) -> (model, level, weights), one level a model
_used: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()  # model -> its last level


def free_bytes(device: torch.device) -> int | None:
    """Memory free for this process's rollout on ``device``: CUDA's free memory plus what torch's allocator holds
    unused, divided among the processes that share the device (``LOCAL_WORLD_SIZE`` over the devices: CUDA's figure
    is the device's, and each would otherwise count all of it); the CPU's available memory (``MemAvailable``); None
    where neither can be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        sharing = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")) // max(1, torch.cuda.device_count()))
        return (free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)) // sharing
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def merge_level(model, requested: str, run: memory_plan.Run, device: torch.device) -> str:
    """The level a compiled rollout of ``model`` (``run``: its rows, prompt and completion lengths, top-k, records;
    its cache of :func:`tarpo.engine.memory_plan.cache_positions` positions) decodes at: ``requested``, or for
    ``auto`` the level chosen at the model's first such rollout and kept (chosen again for a rollout whose KV cache
    is larger than the one it was chosen for; each process chooses its own): the first of :data:`LEVELS` whose
    copies (exact:
    :func:`tarpo.engine.decoder_tensors.merged_bytes`), KV cache (exact) and the plan's transients
    (:func:`tarpo.engine.memory_plan.rollout_transient_bytes`) fit in :func:`free_bytes` less the plan's margin
    (``all`` where the free memory is unknown)."""
    base = unwrap(model)
    if requested != "auto":
        _used[base] = requested
        return requested
    cache = functional_decoder.cache_bytes(model, run.rows, memory_plan.cache_positions(run))
    if base in _chosen and cache <= _chosen[base][1]:  # kept while the rollouts need no larger cache
        _used[base] = _chosen[base][0]
        return _chosen[base][0]
    free, copies = free_bytes(device), {m: decoder_tensors.merged_bytes(model, m) for m in LEVELS}
    transient = memory_plan.rollout_transient_bytes(base.config, run) if free is not None else 0
    level = LEVELS[0] if free is None else next(
        (m for m in LEVELS[:-1] if copies[m] + cache + transient <= (1 - memory_plan.MARGIN) * free), LEVELS[-1])
    logger.info("decode_merge=auto: %s (copies %.2f GiB, KV cache %.2f GiB, transients %.2f GiB, free %s)", level,
                copies[level] / 2 ** 30, cache / 2 ** 30, transient / 2 ** 30,
                "unknown" if free is None else f"{free / 2 ** 30:.1f} GiB")
    _chosen[base] = (level, cache)
    _used[base] = level
    return level


def level_used(model) -> str | None:
    """The level ``model``'s last compiled rollout decoded at (None before its first)."""
    return _used.get(unwrap(model))


@contextlib.contextmanager
def weights_held():
    """Within this block each model's decode weights are built once (at its first compiled rollout) and reused: for
    an evaluation, whose weights do not change between its chunks. Not for a sharded (FSDP2) model: its gathered
    tensors are freed after each rollout."""
    global _held
    outer, _held = _held, {}  # a scope of its own: an inner block never reuses weights an outer one built
    try:
        yield
    finally:
        _held = outer


def decoder_weights(model, level: str):
    """:func:`tarpo.engine.decoder_tensors.build` at ``level``, built once per model within :func:`weights_held`
    (one level held a model: a new level's replace the last's), else every call."""
    if _held is None:
        return decoder_tensors.build(model, level)
    if _held.get(id(model), (None, None))[1] != level:  # the first, or another level (auto chosen again): the
        _held.pop(id(model), None)                       # weights it leaves let go before the new ones are built
        _held[id(model)] = (model, level, decoder_tensors.build(model, level))
    return _held[id(model)][2]
