"""Small test doubles around :class:`tarpo.backbone.Backbone`."""

import torch

from tarpo.backbone import Backbone
from tarpo.tagging import token_piece_fn


class BiasedBackbone(Backbone):
    """Adds a fixed bias to every logit vector (e.g. to make EOS likely)."""

    def __init__(self, model, bias):
        super().__init__(model)
        self.bias = bias

    def logits(self, hidden):
        return super().logits(hidden) + self.bias.to(hidden.dtype)


class ScriptedBackbone(Backbone):
    """Forces row r to emit ``script[r][t]`` at decode step t (batch rows must not be compacted)."""

    def __init__(self, model, script, vocab_size):
        super().__init__(model)
        self.step, self.script, self.V = 0, script, vocab_size
        self.seen = []

    def logits(self, hidden):
        out = super().logits(hidden)
        self.seen.append(out.detach().clone())
        bias = torch.zeros(len(self.script), self.V)
        for r, seq in enumerate(self.script):
            bias[r, seq[min(self.step, len(seq) - 1)]] = 1e4
        self.step += 1
        return out + bias


def encode_prompts(tokenizer, texts):
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def decode_kwargs(tokenizer):
    return dict(piece=token_piece_fn(tokenizer), eos_token_ids=[tokenizer.eos_token_id],
                pad_token_id=tokenizer.pad_token_id)
