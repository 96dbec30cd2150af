"""GPU memory of a run, planned before any weight loads (docs/memory-plan.md).

Parameters are counted exactly: the model's transformers architecture is built from its
config on the ``meta`` device (no weights, no GPU). Everything else is a formula over the
run's shapes, with coefficients counted at the peak of a live-storage measurement of this
project's own rollout and training forward/backward (tests/test_memory_plan.py checks them).

A step has two peaks (the rollout batch is the whole per-process batch ``B``; training runs in
micro-batches ``mb``; ``L = P + T``, prompt and completion lengths; ``w`` = 2 bytes, bf16):

- rollout: weights + LoRA/router/optimizer + KV cache + decode weights + records +
  max(prefill of B x P tokens, one decode step's vocabulary-sized temporaries);
- training micro-batch: the same persistent part + fp32 gradients + the rollout's records (its
  cache and buffers are released when it returns) +
  ``mb * L * per_token`` + max(one layer's recomputed activations, one log-prob chunk).

Worked example, Qwen2.5-3B-Instruct on MATH (B = 64, P = T = 1024) at micro-batch 8, 16,384
tokens: the 36 layers' checkpoints and the copies of the hidden state cost
``w*d*(36 + 5) + 8*d + 2*w*128 + 3*L = 190,976`` bytes a token (2.91 GiB), then the larger of one
recomputed layer, ``4*w*d + 6*w*11008 + 4*16 = 148,544`` bytes a token (2.27 GiB), and one log-prob
chunk, ``16 * 1024 * 151,936`` bytes (2.32 GiB): 5.23 GiB of activations, beside 5.75 GiB of
weights. The rollout's peak holds the 4.5 GiB KV cache (64 rows x 2,048 positions x 36 layers x
1 KiB) and 0.6 GiB of decode weights (the LoRA merged into copies of q|k|v and o, the projections that carry
it: :func:`decode_copy_elements`), released before training::

    >>> s = shapes_of(preset_config("qwen2.5-3b"), ["q_proj", "k_proj", "v_proj", "o_proj"], 32)
    >>> s.params, s.lora_params
    (3085938688, 14745600)
    >>> p = plan(s, Run(rows=64, prompt=1024, completion=1024), micro_batch=8)
    >>> round(p["rollout_gib"], 1), round(p["train_gib"], 1)
    (16.2, 11.1)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from ..config import default
from ..engineering_fields import DECODE_MERGES, MERGED_BLOCKS

GIB = 2 ** 30
GPU_80GB = 79.1 * GIB      # what torch.cuda.mem_get_info reports as the total of an 80 GB A100/H100
MARGIN = 0.04              # of the total: CUDA context, cuBLAS workspaces, allocator fragmentation
CHUNK_BYTES = 16           # fp32 [chunk, V] tensors alive in a log-prob chunk's backward (4 of them)
VOCAB_STEP_BYTES = 48      # per row and vocabulary entry in a decode step: 4 fp32 + 4 int64 (keyed noise)
RECORD_BYTES = 8 + 3 + 3 * 4  # token id, three bools, p_soft / entropy / logp, per row and step (+ k ids, weights)


@dataclass(frozen=True)
class Shapes:
    """What the plan needs of an architecture; ``params`` counts tied embeddings once."""

    params: int
    lora_params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    embedding: int = 0  # parameters of the input embedding and the output head (once if tied)
    projections: tuple = ()  # one decoder layer's linear layers: (name, in, out, has a bias) each
    lora_targets: tuple = ()  # the projections that carry LoRA
    lora_r: int = 0


@dataclass(frozen=True)
class Run:
    """The run's shapes and settings that move memory (defaults: the paper's MATH run)."""

    rows: int                  # completions decoded at once by one process (BATCH / NUM_PROCESSES)
    prompt: int                # max_prompt_length
    completion: int            # max_completion_length
    engine: str = "compiled"   # rollout engine: compiled (a static cache of the bucketed length) or eager
    backend: str = "hf"        # hf or unsloth (offloads its gradient checkpoints to CPU memory)
    soft_top_k: int = default("soft_top_k")
    full_mix: bool = False     # soft steps record a d-wide fp32 mixture (HRPO "full", Soft Tokens)
    router: bool = True        # a router is trained (the learned routings): 2 d + 2 fp32 parameters
    soft_params: int = 0       # the soft input's trained fp32 parameters (SoftInputBase.trained_elements)
    optim_8bit: bool = True    # 8-bit AdamW: 2 bytes of moments per LoRA parameter, else 8
    chunk: int = default("logprob_chunk_size")
    full_kl: bool = False      # token_kl="full": a second fp32 [chunk, V] set for the reference
    decode_merge: str = default("decode_merge")  # the compiled engine's decode weights (TarpoConfig.decode_merge;
    #                                               "auto" not yet chosen: planned at the most it may copy, "all")
    checkpointing: bool = True
    weight_bytes: int = 2      # bf16; 4 for an fp32 (CPU) run
    shards: int = 1            # FSDP2: the processes the parameters are sharded over (tarpo.training.sharding)


def preset_config(model: str):
    """The transformers config of a model preset (:data:`tarpo.architectures.ARCHITECTURES`, offline)."""
    from transformers import AutoConfig

    from ..architectures import ARCHITECTURES
    values = dict(ARCHITECTURES[model.lower()])
    return AutoConfig.for_model(values.pop("model_type"), **values)


def model_config(model: str, preset: str | None = None):
    """A preset's config, a local folder's ``config.json``, or a hub id's config from the hub
    cache; None when none is at hand offline (the plan is then skipped)."""
    from transformers import AutoConfig

    if preset is not None:
        return preset_config(preset)
    try:
        return AutoConfig.from_pretrained(os.path.expanduser(model), local_files_only=True)
    except (OSError, ValueError, json.JSONDecodeError):
        return None


def shapes_of(config, lora_targets, lora_r: int) -> Shapes:
    """Exact parameter counts of ``config``'s architecture built on the meta device, and the
    LoRA parameters PEFT adds: ``r * (in + out)`` for every Linear named in ``lora_targets``."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    lora = sum(lora_r * (m.in_features + m.out_features) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in set(lora_targets))
    from .decoder_tensors import head_dim_of

    heads, head_dim = config.num_attention_heads, head_dim_of(config)
    tied = getattr(config, "tie_word_embeddings", False)
    layer = model.get_decoder().layers[0]
    projections = tuple((name, m.in_features, m.out_features, m.bias is not None) for name, m in (
        *((f"{n}_proj", getattr(layer.self_attn, f"{n}_proj")) for n in "qkvo"),
        *((f"{n}_proj", getattr(layer.mlp, f"{n}_proj")) for n in ("gate", "up", "down"))))
    return Shapes(params=params, lora_params=lora, layers=config.num_hidden_layers, hidden=config.hidden_size,
                  heads=heads, kv_heads=getattr(config, "num_key_value_heads", None) or heads, head_dim=head_dim,
                  intermediate=config.intermediate_size, vocab=config.vocab_size,
                  embedding=config.vocab_size * config.hidden_size * (1 if tied else 2), projections=projections,
                  lora_targets=tuple(n for n, *_ in projections if n in set(lora_targets)), lora_r=lora_r)


def decode_copy_elements(s: Shapes, merge: str, half: bool) -> int:
    """Elements of the copies the compiled engine decodes with at merge level ``merge``
    (:func:`tarpo.engine.decoder_tensors.build`), ``half``: 16-bit weights (the LoRA's fp32 matrices are
    then cast; in fp32 only the grouped ones are copies). Merged (a block that carries LoRA, at a level that merges
    it): a group's one matrix (``sum out x in``, its biases ``sum out`` where any projection has one), a lone
    projection's copy where it carries LoRA. Adapter: a group all with LoRA stacks its ``A`` (``k r x in``) and
    block-diagonalises its ``B`` (``sum out x k r``); else each projection's cast ``r (in + out)``.

    Qwen2.5-3B, bf16, 36 layers. LoRA on q/k/v/o (the paper's): a layer's q|k|v with biases (2,560 x 2,048 + 2,560)
    and o (2,048 x 2,048) at ``all`` and ``attention`` (the MLP carries no LoRA: no copy), the adapter's cast
    matrices alone at ``none``; LoRA on every linear layer: gate|up and down merged too at ``all`` (GiB):

    >>> s = shapes_of(preset_config("qwen2.5-3b"), ["q_proj", "k_proj", "v_proj", "o_proj"], 32)
    >>> [round(2 * decode_copy_elements(s, m, True) / GIB, 2) for m in ("all", "attention", "none")]
    [0.63, 0.63, 0.04]
    >>> s = shapes_of(preset_config("qwen2.5-3b"), [n for n, *_ in s.projections], 32)
    >>> [round(2 * decode_copy_elements(s, m, True) / GIB, 2) for m in ("all", "attention", "none")]
    [5.17, 0.76, 0.17]
    """
    p = {name: (i, o, bias) for name, i, o, bias in s.projections}
    r, lora = s.lora_r, set(s.lora_targets)

    def merged_group(names):
        return sum(p[n][1] * p[n][0] for n in names) + (sum(p[n][1] for n in names) if any(p[n][2] for n in names)
                                                          else 0)

    def merged_one(n):
        return p[n][1] * p[n][0] + (p[n][1] if p[n][2] else 0) if n in lora else 0

    def adapter_one(n):
        return r * (p[n][0] + p[n][1]) if n in lora and half else 0

    def adapter_group(names):
        if all(n in lora for n in names):
            return len(names) * r * (p[names[0]][0] + sum(p[n][1] for n in names))
        return sum(adapter_one(n) for n in names)
    qkv, gate_up = ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")
    level = "all" if merge == "auto" else merge  # not yet chosen: planned at the most it may copy
    blocks = {"attention": {*qkv, "o_proj"}, "mlp": {*gate_up, "down_proj"}}
    covered = set().union(*(blocks[b] for b in MERGED_BLOCKS[level]))

    def group(names):  # merged where the level covers it and one of its projections carries LoRA
        return merged_group(names) if lora & covered & set(names) else adapter_group(names)

    def one(n):
        return merged_one(n) if n in covered else adapter_one(n)
    return s.layers * (group(qkv) + one("o_proj") + group(gate_up) + one("down_proj"))


def cache_positions(run: Run) -> int:
    """KV positions a rollout row holds: the compiled engine's cache length, rounded up to its bucket
    (:func:`tarpo.engine.functional_decoder.cache_length`, the rule's one owner), or the eager engine's exact one."""
    from .functional_decoder import cache_length
    return cache_length(run.prompt, run.completion) if run.engine == "compiled" else run.prompt + run.completion


def persistent_bytes(s: Shapes, run: Run, phase: str = "train") -> dict:
    """Alive the whole run: bf16 weights, fp32 LoRA + router (+ the soft input's parameters) and optimizer state.

    Sharded over ``N = run.shards`` processes (FSDP2), a process holds ``1/N`` of each, and gathers whole
    what it computes with: for the ``"rollout"`` the whole model (beside its own shards), for training
    the embedding and the head (read directly by the scoring) and two decoder layers (the one running
    and the one FSDP prefetches)."""
    d, N = s.hidden, run.shards
    trained_fp32 = (2 * d + 2 if run.router else 0) + run.soft_params  # router, soft input: fp32 Adam state
    moments = 2 if run.optim_8bit else 8
    weights, lora = s.params * run.weight_bytes, s.lora_params * (4 + moments) + trained_fp32 * (4 + 8)
    if N == 1:
        return {"weights": weights, "adapter+optimizer": lora}
    layer = (s.params - s.embedding) / s.layers
    if phase == "rollout":
        gathered, lora_gathered = weights, s.lora_params * 4 + trained_fp32 * 4
    else:
        gathered = (s.embedding + 2 * layer) * run.weight_bytes
        lora_gathered = 2 * s.lora_params / s.layers * 4 + trained_fp32 * 4
    return {"weights": weights / N + gathered, "adapter+optimizer": lora / N + lora_gathered}


def records_bytes(s: Shapes, run: Run) -> int:
    """One copy of a rollout's ``[B, T]`` records (:func:`tarpo.engine.records.new_records`)."""
    per_step = RECORD_BYTES + run.soft_top_k * (8 + 4) + (4 * s.hidden if run.full_mix else 0)
    return run.rows * run.completion * per_step


def rollout_bytes(s: Shapes, run: Run) -> dict:
    """Peak of the rollout of ``run.rows`` rows, by component."""
    w, B, P, C = run.weight_bytes, run.rows, run.prompt, cache_positions(run)
    q, kv_token = s.heads * s.head_dim, s.layers * 2 * s.kv_heads * s.head_dim * w  # K and V, every layer
    # prefill, per prompt token: the MLP's gate/act/up (or attention's q, out and K, V repeated
    # over the cache), four hidden-sized bf16 tensors, cos/sin, the bool mask over the cache
    per_token = max(3 * w * s.intermediate, 2 * w * q + 2 * w * q * C // P) + 4 * w * s.hidden + 2 * w * s.head_dim + C
    prefill = B * P * per_token + (0 if run.engine == "compiled" else B * P * kv_token)
    # a decode step: vocabulary-sized temporaries, the top-k gather; eager: the DynamicCache's
    # last torch.cat copy of one layer's K, and K, V repeated to every head
    step = B * s.vocab * VOCAB_STEP_BYTES + B * run.soft_top_k * s.hidden * 4
    if run.engine == "eager":
        step += B * C * (2 * q + s.kv_heads * s.head_dim) * w + B * C * kv_token
    cache = B * C * kv_token if run.engine == "compiled" else 0
    # the compiled engine's decode weights: merged copies of the projections, or the adapter's (decode_merge)
    copies = w * decode_copy_elements(s, run.decode_merge, w == 2) if run.engine == "compiled" else 0
    return {**persistent_bytes(s, run, "rollout"), "kv_cache": cache, "decode_weights": copies,
            "prefill|decode": max(prefill, step),
            "records": 3 * records_bytes(s, run)}  # last step's batch, the decode buffers, their cut copy


def rollout_transient_bytes(config, run: Run) -> int:
    """What a compiled rollout allocates beside its weights, decode copies and KV cache: the larger of the prefill's
    and a decode step's temporaries, and the records (:func:`rollout_bytes`'s ``prefill|decode`` and ``records``),
    for ``config``'s architecture. :func:`tarpo.engine.decode_weights.merge_level` weighs it at run time."""
    parts = rollout_bytes(shapes_of(config, (), 0), run)
    return parts["prefill|decode"] + parts["records"]


def train_bytes(s: Shapes, run: Run, micro_batch: int) -> dict:
    """Peak of one training micro-batch (forward, reference forward, backward), by component."""
    w, d, L, T = run.weight_bytes, s.hidden, run.prompt + run.completion, run.completion
    q = s.heads * s.head_dim
    kept = s.layers if run.checkpointing and run.backend == "hf" else 1  # Unsloth offloads its checkpoints
    if not run.checkpointing:
        kept = s.layers * 12  # every layer's activations (no checkpointing): an estimate, not measured
    # per token: the checkpointed layer inputs and 5 more bf16 [mb, L, d] (final norm in/out, the
    # gradient of the hidden state, the recomputed layer's norm and residual), two fp32 RMSNorm
    # copies, cos/sin, the attention mask (bool + bf16 bias) over L keys
    per_token = w * d * (kept + 5) + 8 * d + 2 * w * s.head_dim + 3 * L
    # then the larger of: one recomputed layer (q, attention out, K and V repeated to every
    # head; the MLP's gate, act, up, act*up and two gradients; the softmax's logsumexp: a fused kernel's,
    # flash or memory-efficient, never the math kernel's [heads, L, L] scores, as CUDA runs every attention
    # call of both backends fused: tests/test_attention_kernels.py, tests/test_unsloth_trainer.py), one
    # log-prob chunk (fp32 [chunk, V]), one chunk of soft inputs being mixed ([chunk, k, d], every step soft)
    layer = micro_batch * L * (4 * w * q + 6 * w * s.intermediate + 4 * s.heads)
    chunk = CHUNK_BYTES * (2 if run.full_kl else 1) * min(run.chunk, micro_batch * T) * s.vocab
    mixing = min(1024, micro_batch * T) * run.soft_top_k * d * (8 + w)  # gathered rows, fp32 copy, weighted
    # the rollout's cache and buffers are released when it returns (every engine): its records stay,
    # once, in the trainer's buffer of the generation batch
    grads = s.lora_params * 4 / run.shards + (s.lora_params * 4 / s.layers if run.shards > 1 else 0)
    return {**persistent_bytes(s, run), "gradients": grads + 4 * (2 * d + 2),
            "rollout_left": records_bytes(s, run),
            "activations": micro_batch * L * per_token + max(layer, chunk, mixing)}


def plan(s: Shapes, run: Run, micro_batch: int) -> dict:
    """Rollout and training peaks in GiB at ``micro_batch``."""
    rollout, train = sum(rollout_bytes(s, run).values()), sum(train_bytes(s, run, micro_batch).values())
    return {"rollout_gib": rollout / GIB, "train_gib": train / GIB, "peak_gib": max(rollout, train) / GIB,
            "micro_batch": micro_batch}


def usable_bytes(total: float) -> float:
    """What the plan may fill of a GPU of ``total`` bytes."""
    return total * (1 - MARGIN)


def choose_decode_merge(s: Shapes, run: Run, usable: float, requested: str = "auto") -> str:
    """``requested`` (``TarpoConfig.decode_merge``), or for ``auto`` the first of all / attention / none whose
    rollout fits in ``usable`` bytes (none, if none does: the micro-batch's choice then says what does not fit)."""
    if requested != "auto" or run.engine != "compiled":
        return "all" if requested == "auto" else requested
    return next((m for m in DECODE_MERGES[1:-1] if sum(rollout_bytes(s, replace(run, decode_merge=m)).values())
                 <= usable), "none")


def choose_micro_batch(s: Shapes, run: Run, per_process: int, usable: float, requested: int | None = None) -> dict:
    """The plan at ``requested``, or at the largest divisor of ``per_process`` that fits in
    ``usable`` bytes; ``fits`` False (with the plan at micro-batch 1, or at ``requested``) when none does."""
    if requested is not None:
        p = plan(s, run, requested)
        return {**p, "fits": p["peak_gib"] * GIB <= usable}
    for mb in sorted((m for m in range(1, per_process + 1) if per_process % m == 0), reverse=True):
        p = plan(s, run, mb)
        if p["peak_gib"] * GIB <= usable:
            return {**p, "fits": True}
    return {**plan(s, run, 1), "fits": False}
