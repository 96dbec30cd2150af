"""Which SDPA kernel CUDA would run a call on: torch 2.11's dispatch on an H100 (sm90), written from its
source (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, ``select_sdp_backend``), for calls recorded on
the CPU, where every call runs on the CPU kernel whatever its arguments.

The GPU runs the policy in bf16 (the CPU tests in fp32); the rule is the one for bf16. In the priority order:

- **flash** takes no ``attn_mask``; q, k and v of one head size, at most 256; grouped K/V heads (``enable_gqa``)
  taken; ``is_causal`` only with as many queries as keys;
- **memory-efficient** takes a mask; head sizes a multiple of 8 (bf16 on sm80+); as many K/V heads as query
  heads: ``enable_gqa`` with fewer K/V heads is refused before torch 2.14;
- **cuDNN** is left out: whether it is tried first (``check_prefer_cudnn_attention``: the cuDNN and CUDA
  versions of the build) and what it takes (its memory layouts) depend on the image, so no path may count on it;
- **math** otherwise: for bf16 it keeps ``[batch, heads, queries, keys]`` fp32 scores, tens of GB a layer at
  DAPO's lengths.

    >>> kernel(Call((2, 4, 9, 16), (2, 2, 9, 16), (2, 2, 9, 16), mask=True, gqa=True))
    'math'
    >>> kernel(Call((2, 4, 9, 16), (2, 4, 9, 16), (2, 4, 9, 16), mask=True, gqa=False))
    'efficient'
    >>> kernel(Call((2, 4, 9, 16), (2, 2, 9, 16), (2, 2, 9, 16), mask=False, gqa=True))
    'flash'
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch


class Call(NamedTuple):
    query: tuple
    key: tuple
    value: tuple
    mask: bool
    gqa: bool
    is_causal: bool = False
    requires_grad: bool = False


def kernel(call: Call) -> str:
    """``"flash"``, ``"efficient"`` or ``"math"``: the first kernel of torch 2.11's CUDA order that takes ``call``."""
    (_, hq, lq, dq), (_, hk, lk, dk), (_, hv, _, dv) = call.query, call.key, call.value
    grouped = hk != hq or hv != hq
    if grouped and not call.gqa:
        raise ValueError(f"{call}: fewer K/V heads without enable_gqa is an error on every kernel")
    if (not call.mask and dq == dk == dv <= 256 and not (call.is_causal and lq != lk)
            and hq % hk == 0 and hq % hv == 0):
        return "flash"
    if dq == dk and dq % 8 == 0 and dv % 8 == 0 and not grouped:
        return "efficient"
    return "math"


@contextlib.contextmanager
def recorded_sdpa(*modules):
    """Every call of ``torch.nn.functional.scaled_dot_product_attention`` (and of the same name bound in
    ``modules``) while the context is open, as :class:`Call` records in the list it yields."""
    calls: list[Call] = []
    original = torch.nn.functional.scaled_dot_product_attention

    def recording(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                  **kwargs):
        calls.append(Call(tuple(query.shape), tuple(key.shape), tuple(value.shape), attn_mask is not None,
                          bool(enable_gqa), bool(is_causal),
                          torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))))
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa, **kwargs)
    bound = [(m, m.scaled_dot_product_attention) for m in modules]
    torch.nn.functional.scaled_dot_product_attention = recording
    for m, _ in bound:
        m.scaled_dot_product_attention = recording
    try:
        yield calls
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
        for m, fn in bound:
            m.scaled_dot_product_attention = fn


def on_math(calls) -> list[Call]:
    """The calls CUDA would run on the math kernel."""
    return [c for c in calls if kernel(c) == "math"]
