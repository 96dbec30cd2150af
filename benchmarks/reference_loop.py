"""A reference-style hybrid decode loop, kept only as a speed baseline for the benchmarks.

It does what the published reference code does and docs/algorithm.md §1 forbids: the soft input is
the full-vocabulary product ``softmax(z/T) @ E`` (O(B V d) per step instead of a gather of k
rows), and the answer tag is found by re-decoding every row's whole completion at every
step (O(T^2)). Routing and sampling follow :mod:`tarpo.engine.rollout` so that the work compared is
the same; it returns the generated ids only.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from tarpo.engine.backbone import Backbone, positions_from_mask


@torch.no_grad()
def reference_generate(model, router, tokenizer, prompt_ids, prompt_mask, max_new_tokens, temperature=0.5,
                       tag="####"):
    backbone = Backbone(model)
    E = backbone.embed_weight
    B = prompt_ids.shape[0]
    mask = prompt_mask.long()
    pos = positions_from_mask(mask)
    cache = DynamicCache(config=backbone.config)
    hidden = backbone.hidden(E[prompt_ids], mask, pos, cache)[:, -1]
    next_pos = pos[:, -1] + 1
    out = torch.full((B, max_new_tokens), tokenizer.pad_token_id, dtype=torch.long, device=prompt_ids.device)
    for t in range(max_new_tokens):
        logits = backbone.logits(hidden).float() / temperature
        probs = torch.softmax(logits, dim=-1)
        tokens = torch.multinomial(probs, 1).squeeze(-1)
        out[:, t] = tokens
        texts = tokenizer.batch_decode(out[:, :t + 1])  # the whole completion, every step
        thinking = torch.tensor([tag not in s for s in texts], device=prompt_ids.device)
        soft = thinking & (torch.rand(B, device=prompt_ids.device) < router.log_probs(hidden)[:, 1].exp())
        inputs = E[tokens]
        if soft.any():
            inputs[soft] = (probs[soft].to(E.dtype) @ E).to(inputs.dtype)  # full-vocabulary mixture
        mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
        hidden = backbone.hidden(inputs[:, None], mask, next_pos[:, None], cache)[:, -1]
        next_pos = next_pos + 1
    return out
