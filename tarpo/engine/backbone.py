"""Uniform access to a causal LM's parts: input embedding, decoder, ``lm_head``.

The rollout and the trainer never call ``model(...)``: they feed ``inputs_embeds`` to the
decoder, which returns the **normed** final hidden state ``h_t`` (the exact ``lm_head``
input the router reads, docs/algorithm.md §1), and apply the head themselves. A PEFT model works
unchanged: LoRA layers live inside the decoder, and ``peft_model.disable_adapter()``
turns them off for the reference pass.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The ``*ForCausalLM`` under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class Backbone:
    def __init__(self, model: nn.Module):
        base = unwrap(model)
        self.model = model
        self.decoder = base.get_decoder()
        self.lm_head = base.get_output_embeddings()
        self.embedding = base.get_input_embeddings()
        self.config = base.config

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.embedding.weight

    def hidden(self, inputs_embeds, attention_mask, position_ids, cache=None, token_ids=None) -> torch.Tensor:
        """Normed final hidden states [B, L, d]; ``cache`` is extended in place. ``token_ids``
        (the ids behind the inputs, placeholders at soft steps) serve backends that take
        ids (:class:`tarpo.models.backends.UnslothBackbone`); this one feeds ``inputs_embeds``."""
        out = self.decoder(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                           position_ids=position_ids, past_key_values=cache, use_cache=cache is not None)
        return out.last_hidden_state

    def adapter_disabled(self):
        """Context in which the backbone is the reference pi_ref (LoRA adapter off)."""
        if not hasattr(self.model, "disable_adapter"):
            raise ValueError("a KL penalty (beta > 0) needs a PEFT model: the reference is the backbone "
                             "with its adapter disabled")
        return self.model.disable_adapter()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's logits; an fp32 head (TRL's ``cast_lm_head_to_fp32`` over 16-bit weights) computes them in fp32,
        outside the run's autocast, in the rollout and the training forward alike."""
        if self.lm_head.weight.dtype != torch.float32:
            return self.lm_head(hidden)
        with torch.autocast(hidden.device.type, enabled=False):
            return self.lm_head(hidden.float())

    def decoding(self):
        """Context for a decode loop (a backend may switch modes, see tarpo.models.backends.UnslothBackbone)."""
        return contextlib.nullcontext()


def distinct_prompts(prompt_ids: torch.Tensor, mask: torch.Tensor):
    """Each distinct row of a left-padded batch once (the ids and the mask together): ``(ids [U, P], mask [U, P],
    inverse [B])``, row ``b`` being distinct row ``inverse[b]``. Both engines' prefills run these rows only."""
    P = prompt_ids.shape[1]
    unique, inverse = torch.unique(torch.cat([prompt_ids, mask.to(prompt_ids.dtype)], 1), dim=0, return_inverse=True)
    return unique[:, :P], unique[:, P:], inverse


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for left-padded rows: 0 at each row's first real token (as ``generate``)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
