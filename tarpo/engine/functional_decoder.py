"""The Qwen2 / Llama decoder as a function of the model's own tensors, for the compiled engine
(docs/rollout-engines.md, "One engine for every backend").

The compiled engine needs a decoder it can trace into one graph with a static KV cache. The model's own
module forwards are not that decoder on every backend: Unsloth replaces the Qwen2 and Llama class forwards
process-wide with its own (no static cache, host syncs, Triton kernels). So the engine reads the tensors
the modules hold, once per rollout (:func:`tarpo.engine.decoder_tensors.build`), and runs the same
arithmetic as transformers' modules in the same order (:func:`forward`): RMSNorm in fp32, q/k/v (with
Qwen2's biases), rotary embedding, attention, o, SwiGLU MLP, each projection ``W x + b + s B (A x)`` as
PEFT computes it; the LoRA of projections that read one input (q, k, v; gate, up) is one product an adapter
(:class:`tarpo.engine.decoder_tensors.Group`), as each output is the same dot product (the rounding may differ
with the matmul's shape). Whichever backend loaded the model, and whichever forwards it replaced, the step reads
the same numbers; under the rollout's autocast every matmul runs in the weights' 16-bit dtype, as in the eager
engine.

The cache is one key and one value tensor per layer, ``[B, H_kv, L, D]``, written at cache slots given as
a tensor (the step's slot is loop state, so one graph serves every step and prompt length). A single
query position attends with its group's query heads laid along the query axis (the grouped K/V read in
place, :func:`tarpo.engine.grouped_attention.grouped_query_sdpa`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .backbone import unwrap
from .decoder_tensors import DecoderWeights, Group, Layer, Projection, head_dim_of
from .grouped_attention import grouped_query_sdpa

CACHE_BUCKET = 64  # cache lengths are rounded up to a multiple of this (docs/rollout-engines.md)


def cache_length(prompt_len: int, new_tokens: int, prompt_budget: int | None = None) -> int:
    """Positions of the rollout's cache: the prompt budget (else this prompt) + new tokens, rounded
    up to a multiple of :data:`CACHE_BUCKET`.

        >>> cache_length(37, 100), cache_length(37, 100, prompt_budget=1024)
        (192, 1152)
    """
    return -(-(max(prompt_len, prompt_budget or 0) + new_tokens) // CACHE_BUCKET) * CACHE_BUCKET


def known_span(span, cache) -> None:
    """What is known of a decode step's span of cache positions when its size is unbacked (a compiled step's,
    :class:`tarpo.engine.step_replay.SpanSteps`): at least one bucket, at most the cache, so that the trace needs no
    guard on it."""
    torch._check(span >= CACHE_BUCKET)
    torch._check(span <= cache[0][0].shape[2])


def cache_bytes(model, batch: int, length: int) -> int:
    """Bytes of :func:`new_cache` of ``model`` (keys and values of every layer in the compute dtype)."""
    base = unwrap(model)
    config = base.config
    return (2 * config.num_hidden_layers * batch * config.num_key_value_heads * length * head_dim_of(config)
            * base.get_input_embeddings().weight.element_size())


def new_cache(w: DecoderWeights, batch: int, length: int, dtype, device) -> tuple:
    """Keys and values of every layer, ``[B, H_kv, L, D]`` each, zero."""
    shape = (batch, w.kv_heads, length, w.head_dim)
    return tuple((torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                 for _ in w.layers)


def _rms_norm(x, weight, eps):
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _linear(x, p: Projection):
    out = F.linear(x, p.weight, p.bias)
    dtype = out.dtype
    for a, b, b_bias, scaling in p.lora:
        out = out + F.linear(F.linear(x.to(a.dtype), a), b, b_bias) * scaling
    return out.to(dtype)


def _group_linear(x, g: Group) -> tuple:
    """Each projection of the group applied to ``x``: ``W x + b + s B (A x)``, the LoRA term one product an adapter;
    a merged group (one projection) is one product, split."""
    outs = [_linear(x, p) for p in g.projections]
    if len(outs) == 1 and len(g.sizes) > 1:
        return tuple(outs[0].split(g.sizes, dim=-1))
    if not g.lora:
        return tuple(outs)
    dtype = outs[0].dtype
    total = None
    for a, b, b_bias, scaling in g.lora:
        term = F.linear(F.linear(x.to(a.dtype), a), b, b_bias) * scaling
        total = term if total is None else total + term
    return tuple((out + part).to(dtype) for out, part in zip(outs, total.split(g.sizes, dim=-1)))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _cos_sin(w: DecoderWeights, positions, dtype):
    """cos and sin [B, q, D] at ``positions`` [B, q], as transformers' rotary embedding computes them."""
    with torch.autocast(positions.device.type, enabled=False):
        freqs = (w.inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)
                 @ positions[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * w.rope_scale, emb.sin() * w.rope_scale
    return cos.to(dtype), sin.to(dtype)


def _attend(q, keys, values, mask):
    """SDPA of q [B, H, q, D] over the cache [B, H_kv, L, D]; ``mask`` [B, 1, q, L] bool (True: attend)."""
    from transformers.integrations.sdpa_attention import repeat_kv

    groups = q.shape[1] // keys.shape[1]
    if q.shape[2] == 1 and groups > 1:  # one position: K/V read in place
        return grouped_query_sdpa(q, keys, values, mask)
    return F.scaled_dot_product_attention(q, repeat_kv(keys, groups), repeat_kv(values, groups), attn_mask=mask)


def forward(w: DecoderWeights, inputs_embeds, positions, cache, slots, mask, length=None, regional=False):
    """Normed final hidden states [B, q, d] of ``inputs_embeds`` [B, q, d] at rotary ``positions`` [B, q]; the
    keys and values of the q positions are written into ``cache`` at ``slots`` [q] (long), and every position
    attends to cache slots ``< length`` (default: all) where ``mask`` [B, 1, q, length] is True. ``regional``:
    under ``torch.compile``, each layer is one nested compile region (:func:`_layer_region`), compiled once."""
    x = inputs_embeds
    cos, sin = _cos_sin(w, positions, x.dtype)
    cos, sin = cos[:, None], sin[:, None]
    layer_fn = _layer_region if regional else _layer
    for layer, kv in zip(w.layers, cache):
        x = layer_fn(layer, x, (cos, sin), kv, (slots, mask, length), (w.eps, w.head_dim))
    return _rms_norm(x, w.norm, w.eps)


def _layer(layer: Layer, x, rope, kv, where, sizes):
    """One decoder layer of :func:`forward`: ``rope`` (cos, sin), ``kv`` its (keys, values) cache, ``where``
    (slots, mask, length), ``sizes`` (eps, head_dim)."""
    (cos, sin), (keys, values), (slots, mask, length), (eps, head_dim) = rope, kv, where, sizes
    B, n, _ = x.shape
    seen = slice(None) if length is None else slice(0, length)
    residual = x
    h = _rms_norm(x, layer.input_norm, eps)
    q, k, v = (y.view(B, n, -1, head_dim).transpose(1, 2) for y in _group_linear(h, layer.qkv))
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    keys.index_copy_(2, slots, k.to(keys.dtype))
    values.index_copy_(2, slots, v.to(values.dtype))
    out = _attend(q, keys[:, :, seen], values[:, :, seen], mask)
    x = residual + _linear(out.transpose(1, 2).reshape(B, n, -1), layer.o)
    residual = x
    h = _rms_norm(x, layer.post_norm, eps)
    gate, up = _group_linear(h, layer.gate_up)
    return residual + _linear(F.silu(gate) * up, layer.down)


# The layer as a nested compile region: torch.compile traces and compiles it once and stamps that code out for
# every layer (the same shapes), so the step's compile does not grow with depth (docs/rollout-engines.md); eagerly,
# a plain call. The price: no fusion across a layer's boundary (a few more kernels a layer).
_layer_region = torch.compiler.nested_compile_region(_layer)


def prefill_mask(prompt_mask: torch.Tensor) -> torch.Tensor:
    """[B, 1, P, P] bool: causal and the prompt's padding (a fully padded query row attends to itself, so that
    its softmax is defined; its output is never read)."""
    P = prompt_mask.shape[1]
    causal = torch.ones(P, P, dtype=torch.bool, device=prompt_mask.device).tril()
    mask = causal[None] & prompt_mask.bool()[:, None, :]
    return (mask | torch.eye(P, dtype=torch.bool, device=prompt_mask.device)[None])[:, None]


def decode_mask(cache_mask: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """[B, 1, 1, L] bool for the position at cache ``slot`` (0-d long): the slots written so far that are
    not padding (``cache_mask`` [B, L]: the prompt's mask, then ones)."""
    written = torch.arange(cache_mask.shape[1], device=cache_mask.device) <= slot
    return (cache_mask.bool() & written)[:, None, None, :]
