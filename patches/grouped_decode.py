"""Patch: Unsloth's decode attention reads grouped K/V heads in place when rows are padded.

Target (unsloth 2026.10.7, ``unsloth/models/llama.py``):
``LlamaAttention_fast_forward_inference(self, hidden_states, past_key_value, position_ids,
do_prefill=False, attention_mask=None, rotary_seq_len=None)``, the per-layer attention of the
single-token decode (Llama's and Qwen2's). For a batch of more than one row it calls the module's
``scaled_dot_product_attention(Qn, Knn, Vnn, attn_mask=attention_mask, is_causal=False,
enable_gqa=True)``; with a padding mask the only kernel that takes ``enable_gqa`` is the math
one, which copies K/V once per query head (the whole cache, x heads/kv_heads, every step).

The patch builds the decode with Unsloth's own factory,
``_LlamaModel_fast_forward_inference(attention_fast_forward_inference=...)``, around an attention
that runs Unsloth's during which the module's ``scaled_dot_product_attention`` is
:func:`grouped_sdpa`: for one query position and fewer K/V heads it lays each group's query heads
along the query axis, ``[B, H, 1, D] -> [B, H_kv, H / H_kv, D]``, and attends to the cache as it is
(the mask ``[B, 1, 1, L]`` broadcasts): :func:`tarpo.engine.grouped_attention.grouped_query_sdpa`, which
the transformers path and the compiled engine use too; any other call goes to torch's function
unchanged. :func:`check_target` verifies, from the installed source, that the target still makes that call.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import textwrap

import torch

from ..engine.grouped_attention import grouped_query_sdpa
from .versions import EXPECTED_VERSIONS, PatchError

TARGET = "LlamaAttention_fast_forward_inference"


def grouped_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False, **kwargs):
    """``torch.nn.functional.scaled_dot_product_attention`` that reads grouped K/V heads in place
    for a single query position (``enable_gqa`` semantics: query head h reads K/V head
    ``h // (H / H_kv)``)."""
    if not enable_gqa or query.shape[2] != 1 or key.shape[1] == query.shape[1] or is_causal or dropout_p or kwargs:
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
            enable_gqa=enable_gqa, **kwargs)
    if attn_mask is not None and attn_mask.dim() == 4 and attn_mask.shape[1] != 1:
        raise ValueError(f"grouped decode attention needs a mask shared by the heads, got {tuple(attn_mask.shape)}")
    return grouped_query_sdpa(query, key, value, attn_mask, scale)


@contextlib.contextmanager
def _module_sdpa(module, fn):
    previous = module.scaled_dot_product_attention
    module.scaled_dot_product_attention = fn
    try:
        yield
    finally:
        module.scaled_dot_product_attention = previous


def grouped_attention(unsloth_llama):
    """Unsloth's decode attention with :func:`grouped_sdpa` in place of the module's SDPA."""
    attention = getattr(unsloth_llama, TARGET)

    def attention_grouped(self, hidden_states, past_key_value, position_ids, do_prefill=False, attention_mask=None,
                          rotary_seq_len=None):
        with _module_sdpa(unsloth_llama, grouped_sdpa):
            return attention(self, hidden_states, past_key_value, position_ids, do_prefill=do_prefill,
                             attention_mask=attention_mask, rotary_seq_len=rotary_seq_len)
    attention_grouped._tarpo_grouped = True
    return attention_grouped


def decode_function():
    """Unsloth's single-token decode (``LlamaModel_fast_forward_inference``), its attention grouped."""
    import unsloth.models.llama as unsloth_llama

    check_target(inspect.getsource(getattr(unsloth_llama, TARGET)))
    return unsloth_llama._LlamaModel_fast_forward_inference(attention_fast_forward_inference=grouped_attention(
        unsloth_llama))


def check_target(source: str) -> None:
    """The target calls ``scaled_dot_product_attention(..., attn_mask=..., enable_gqa=True)`` by the
    module's name (what :func:`grouped_attention` swaps); else :class:`PatchError` naming it."""
    tree = ast.parse(textwrap.dedent(source))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "scaled_dot_product_attention"]
    gqa = [c for c in calls
           if any(k.arg == "enable_gqa" and isinstance(k.value, ast.Constant) and k.value.value is True
                  for k in c.keywords) and any(k.arg == "attn_mask" for k in c.keywords)]
    if not gqa:
        raise PatchError(f"unsloth/models/llama.py: {TARGET} no longer calls scaled_dot_product_attention(..., "
                         f"attn_mask=..., enable_gqa=True) (tarpo.patches.grouped_decode expects unsloth=="
                         f"{EXPECTED_VERSIONS['unsloth']})")
