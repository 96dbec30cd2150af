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


def stand_in_unsloth_decode(model, monkeypatch):
    """Make ``model`` look like one that ``tarpo.patches.apply`` prepared, on the transformers path.

    What the real patch does is stood in for piece by piece: the backend marker on the
    ``*ForCausalLM``; a class ``forward`` carrying the decode patch's marker; ``h_t`` left on
    the model as ``_tarpo_hidden`` at each call (here by a hook on the final norm); Unsloth's
    inference-mode switch made a no-op. Returns the hook handle (``.remove()`` stops the
    hidden state being left, as a dropped patch would).
    """
    import contextlib

    from tarpo.backbone import unwrap
    from tarpo.hooks import UnslothBackbone, final_norm
    from tarpo.patches import BACKEND_MARKER

    base = unwrap(model)
    original = type(base).forward

    def forward(self, *args, **kwargs):
        return original(self, *args, **kwargs)
    forward._tarpo_decode_hidden = True
    monkeypatch.setattr(type(base), "forward", forward)
    monkeypatch.setattr(UnslothBackbone, "inference_mode", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(base, BACKEND_MARKER, "unsloth", raising=False)
    return final_norm(model).register_forward_hook(lambda m, a, out: setattr(base, "_tarpo_hidden", out))


def free_port() -> int:
    """A TCP port nobody listens on now: for ``accelerate launch --main_process_port``, so that runs on gloo
    started by tests in parallel (pytest-xdist) never meet on accelerate's default port 29500."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
