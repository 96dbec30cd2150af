"""Decode-step attention against a cache with fewer K/V heads than query heads (docs/rollout-engines.md).

Both rollout engines decode through :func:`grouped_decode_attention` where the model runs
transformers' SDPA attention (:class:`grouped_decode_attention_on`); Unsloth's decode path has its
own version (``patches/grouped_decode.py``).
"""

from __future__ import annotations

import torch

GROUPED_DECODE = "tarpo_grouped_decode"


def grouped_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention of one new position against a cache with fewer K/V heads than query heads.

    transformers' SDPA path copies K and V once per query head of a group (``repeat_kv``)
    whenever there is a padding mask: at every decode step, the whole static cache, times the
    group size. For a single query position the group's query heads can be laid along the
    query-length axis instead, ``[B, H, 1, D] -> [B, H_kv, H / H_kv, D]``, and attend to the
    cache as it is; the mask ``[B, 1, 1, L]`` broadcasts over them. Query head ``h`` reads K/V
    head ``h // (H / H_kv)``, as ``repeat_kv`` arranges. Other shapes (the prefill) go to SDPA.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    B, H, q_len, D = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or kv_heads == H:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    grouped = query.reshape(B, kv_heads, H // kv_heads, D)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask,
                                                           scale=scaling)
    return out.reshape(B, H, 1, D).transpose(1, 2).contiguous(), None


def decode_mask(*args, **kwargs):
    """transformers' SDPA mask, always built for a single query position. Its default first asks whether
    the mask could be skipped (``_ignore_causal_mask_sdpa``), which reads the padding mask on the host:
    one sync at every decode step. The prefill keeps the default (one read per rollout)."""
    from transformers.masking_utils import sdpa_mask

    if kwargs.get("q_length") == 1:
        kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


class grouped_decode_attention_on:
    """Context: the model's attention is :func:`grouped_decode_attention` (registered with
    transformers' attention and mask interfaces; masks as for SDPA, :func:`decode_mask`), restored on exit."""

    def __init__(self, config):
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        AttentionInterface.register(GROUPED_DECODE, grouped_decode_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_DECODE, decode_mask)
        self.config = config

    def __enter__(self):
        self.was = self.config._attn_implementation
        self.config._attn_implementation = GROUPED_DECODE

    def __exit__(self, *exc):
        self.config._attn_implementation = self.was
