"""Decode-step attention against a cache with fewer K/V heads than query heads (docs/rollout-engines.md).

Both rollout engines decode through :func:`grouped_decode_attention` where the model runs
transformers' SDPA attention (:class:`grouped_decode_attention_on`); Unsloth's decode path has its
own version (``patches/grouped_decode.py``).
"""

from __future__ import annotations

import torch

GROUPED_DECODE = "tarpo_grouped_decode"


def grouped_query_sdpa(query, key, value, attn_mask=None, scale=None):
    """SDPA of one query position ``query`` [B, H, 1, D] over K/V with fewer heads [B, H_kv, L, D], the
    group's query heads laid along the query axis, ``[B, H_kv, H / H_kv, D]``: query head ``h`` reads K/V
    head ``h // (H / H_kv)``, as ``repeat_kv`` arranges, and K/V are read in place. ``attn_mask`` is shared
    by the heads (``[B, 1, 1, L]``). Returns [B, H, 1, D]."""
    B, H, _, D = query.shape
    grouped = query.reshape(B, key.shape[1], H // key.shape[1], D)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attn_mask, scale=scale)
    return out.reshape(B, H, 1, D)


def grouped_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention of one new position against a cache with fewer K/V heads than query heads.

    transformers' SDPA path copies K and V once per query head of a group (``repeat_kv``)
    whenever there is a padding mask: at every decode step, the whole static cache, times the
    group size. For a single query position the group's query heads are laid along the
    query-length axis instead (:func:`grouped_query_sdpa`). Other shapes (the prefill) go to SDPA.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1 or key.shape[1] == query.shape[1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return grouped_query_sdpa(query, key, value, attention_mask, scaling).transpose(1, 2).contiguous(), None


def sdpa_decode_mask(*args, **kwargs):
    """transformers' SDPA mask, always built for a single query position. Its default first asks whether
    the mask could be skipped (``_ignore_causal_mask_sdpa``), which reads the padding mask on the host:
    one sync at every decode step. The prefill keeps the default (one read per rollout)."""
    from transformers.masking_utils import sdpa_mask

    if kwargs.get("q_length") == 1:
        kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


class grouped_decode_attention_on:
    """Context: the model's attention is :func:`grouped_decode_attention` (registered with
    transformers' attention and mask interfaces; masks as for SDPA, :func:`sdpa_decode_mask`), restored on exit."""

    def __init__(self, config):
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        AttentionInterface.register(GROUPED_DECODE, grouped_decode_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_DECODE, sdpa_decode_mask)
        self.config = config

    def __enter__(self):
        self.was = self.config._attn_implementation
        self.config._attn_implementation = GROUPED_DECODE

    def __exit__(self, *exc):
        self.config._attn_implementation = self.was
