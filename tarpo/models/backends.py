"""The Unsloth backend's backbone: soft inputs through a module hook, for a decode path that takes only ids.

Unsloth's fast single-token decode path is called with ``input_ids`` and returns logits.
TARPO needs two things from it that :class:`tarpo.engine.backbone.Backbone` gets from the
decoder directly: to feed a mixture instead of ``E(v_t)`` for soft rows, and to read the
normed final hidden state ``h_t``. :class:`UnslothBackbone` gets both:

- :class:`EmbeddingOverride`, a forward hook on the input-embedding module, replaces the
  embedding output of the rows given for the next call (the ids keep flowing; hard rows
  keep ``E(v_t)`` bit for bit);
- ``tarpo.patches`` makes the decode step leave ``h_t``, the exact ``lm_head`` input, on the model.

On the transformers path the override, with a hook on the final norm in place of the patch, gives the
same hidden states and rollouts as passing ``inputs_embeds`` (``tests/test_hooks.py``).
"""

from __future__ import annotations

import contextlib

import torch

from ..engine.backbone import Backbone, unwrap


class EmbeddingOverride:
    """Replace rows of the next output of an embedding module.

    >>> emb = torch.nn.Embedding(5, 2)
    >>> hook = EmbeddingOverride(emb)
    >>> ids = torch.tensor([[1, 2]])
    >>> hook.set(torch.full((1, 2, 2), 7.0), torch.tensor([[False, True]]))
    >>> out = emb(ids)
    >>> torch.equal(out[0, 0], emb.weight[1]), out[0, 1].tolist()
    (True, [7.0, 7.0])
    >>> torch.equal(emb(ids), emb.weight[ids])  # one call only
    True
    """

    def __init__(self, module: torch.nn.Module):
        self.pending = None
        self.handle = module.register_forward_hook(self._hook)

    def set(self, embeds: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Use ``embeds`` [B, L, d] for the next call where ``rows`` [B, L] is True (all if None)."""
        self.pending = (embeds, rows)

    def _hook(self, module, args, output):
        if self.pending is None:
            return output
        embeds, rows = self.pending
        self.pending = None
        if embeds.shape != output.shape:
            raise RuntimeError(f"soft inputs of shape {tuple(embeds.shape)} for an embedding output of shape "
                               f"{tuple(output.shape)}")
        if rows is None:  # a fresh tensor: Unsloth's decode path writes into its input in place
            return embeds.to(output.dtype, copy=True)
        out = output.clone()
        out[rows] = embeds[rows].to(output.dtype)
        return out

    def remove(self) -> None:
        self.handle.remove()


def additive_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ``[B, 1, 1, L]`` float mask of a 2-D padding mask: 0 where attended, the dtype's lowest where not.

    >>> additive_mask(torch.tensor([[0, 1, 1]]), torch.bfloat16).tolist()
    [[[[-3.3895313892515355e+38, 0.0, 0.0]]]]
    """
    return torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device).masked_fill_(
        attention_mask == 0, torch.finfo(dtype).min)[:, None, None, :]


class UnslothBackbone(Backbone):
    """Drives Unsloth's fast decode path (``tarpo.patches`` applied to the model): the eager engine's
    decode on the Unsloth backend (the compiled engine reads the model's tensors instead,
    :mod:`tarpo.engine.functional_decoder`).

    The prompt is prefilled through the decoder (``last_hidden_state`` is post-norm), each
    decode step through the patched ``*ForCausalLM.forward``, which takes Unsloth's
    single-token path and leaves ``h_t`` on the model; soft rows come in through the
    embedding override. Unsloth keeps K/V in per-layer buffers sized for a fixed batch, so
    finished rows are not compacted (``fixed_batch``), and the returned cache is passed back
    as is (kept here, keyed by the rollout's cache object). Decoding runs in Unsloth's
    inference mode (:meth:`decoding`). The training forward (no cache) feeds
    ``inputs_embeds`` to the decoder like :class:`Backbone`.

    Each decode step calls the model class's own ``forward``, not the instance attribute:
    under bf16 mixed precision accelerate replaces ``model.forward`` on the instance with a
    wrapper that copies every output, the whole KV cache included, to fp32.

    Freshness (every rollout runs with the current weights, every step's ``h_t`` is that
    step's): a new rollout checks that the decode patch is still installed on the model's
    class (a later ``from_pretrained`` re-runs Unsloth's ``pre_patch``, which drops it) and
    drops Unsloth's per-parameter LoRA copies (``_fast_lora``, made once in the decode
    path's dtype and otherwise cleared only by ``for_training``); each step clears
    ``_tarpo_hidden`` before the call and fails if the call did not set it again.

    Release: when a rollout ends (:meth:`decoding` exits, on an error too) :meth:`end_rollout`
    drops the returned cache (``_past``, views of Unsloth's paged K/V buffers) and the buffers
    themselves (``paged_attention`` and the decode scratch Unsloth leaves on every attention
    module), so no K/V of the rollout is alive during the training forward. Unsloth would
    otherwise keep them until its next prefill, layer by layer.
    """

    fixed_batch = True
    transformers_decode = False  # decode steps run Unsloth's attention (tarpo.patches.grouped_decode)

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        self.override = EmbeddingOverride(self.embedding)
        self.base = unwrap(model)
        self._session, self._past = None, None

    def hidden(self, inputs_embeds, attention_mask, position_ids, cache=None, token_ids=None) -> torch.Tensor:
        if cache is None or token_ids is None:
            self.decoder._has_no_labels = False  # keep the gradient of rebuilt inputs (tarpo.patches.training_forward)
            return super().hidden(inputs_embeds, attention_mask, position_ids, cache)
        if self._session is not cache:  # a new rollout: prefill (resets Unsloth's paged K/V buffers)
            self.begin_rollout()
            out = self.decoder(input_ids=token_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=True)
            self._session, self._past = cache, out.past_key_values
            return out.last_hidden_state
        self.override.set(inputs_embeds)
        self.base._tarpo_hidden = None
        # return_dict: Unsloth's decode branch returns a plain tuple unless asked (it fills the
        # default only on its other branch). The mask goes in as the [B, 1, 1, L] additive float mask Unsloth
        # would build from the 2-D one: from a 2-D mask it first asks whether the mask is all ones, a host sync
        # at every step (unsloth/models/_attn_mask_compat.py, _ignore_causal_mask_sdpa); a boolean one is
        # refused on CUDA by its _unmask_unattended (a branch the CPU never takes: tests/workers/unsloth_cpu.py).
        out = class_forward(self.model)(input_ids=token_ids, attention_mask=additive_mask(attention_mask,
                                                                                         inputs_embeds.dtype),
                                        position_ids=position_ids, past_key_values=self._past, use_cache=True,
                                        return_dict=True)
        self.override.pending = None
        self._past = out.past_key_values
        hidden = self.base.__dict__.get("_tarpo_hidden")
        if hidden is None:
            raise RuntimeError("Unsloth's decode step did not leave its hidden state on the model: "
                               "tarpo.patches.decode_hidden is not in the forward that ran")
        return hidden

    def begin_rollout(self) -> None:
        """Check the decode patch and drop stale LoRA copies before a rollout's first step."""
        from ..patches.targets import PatchError

        if not getattr(type(self.base).forward, "_tarpo_decode_hidden", False):
            raise PatchError(f"{type(self.base).__name__}.forward is no longer tarpo's decode patch (a later "
                             "from_pretrained re-ran Unsloth's pre_patch): call tarpo.patches.apply(model) again "
                             "after loading")
        for param in self.model.parameters():
            param.__dict__.pop("_fast_lora", None)
        self.base._tarpo_hidden = None

    def end_rollout(self) -> None:
        """Drop everything the rollout's cache holds (see the class docstring); the next rollout prefills."""
        self._session, self._past = None, None
        self.override.pending = None
        self.base.__dict__["_tarpo_hidden"] = None
        for module in self.model.modules():
            if "paged_attention" in module.__dict__:
                for name in UNSLOTH_DECODE_BUFFERS:
                    module.__dict__.pop(name, None)

    @contextlib.contextmanager
    def decoding(self):
        try:
            with self.inference_mode():
                yield
        finally:
            self.end_rollout()

    def inference_mode(self):
        return _unsloth_inference_mode(self.model)


# What Unsloth's decode attention (LlamaAttention_fast_forward_inference, unsloth 2026.10.7) leaves on each
# attention module: the paged K/V buffer and its K/V views, and its per-batch scratch (temp_O may be a view of
# temp_QA). Unsloth deletes all but temp_O at its next prefill; the next decode step after a prefill makes them anew.
UNSLOTH_DECODE_BUFFERS = ("paged_attention", "paged_attention_K", "paged_attention_V", "temp_QA", "temp_KV", "RH_Q",
                          "attention", "temp_O")


def class_forward(module: torch.nn.Module):
    """``module``'s class ``forward`` bound to it, skipping wrappers set on the instance.

    >>> m = torch.nn.Identity()
    >>> m.forward = lambda x: x + 1          # what accelerate's prepare_model does, in spirit
    >>> m(torch.zeros(1)).item(), class_forward(m)(torch.zeros(1)).item()
    (1.0, 0.0)
    """
    return type(module).forward.__get__(module)


class _unsloth_inference_mode:
    def __init__(self, model):
        self.model = model

    def __enter__(self):
        from unsloth import FastLanguageModel
        self.was_training = self.model.training
        FastLanguageModel.for_inference(self.model)

    def __exit__(self, *exc):
        from unsloth import FastLanguageModel
        if self.was_training:
            FastLanguageModel.for_training(self.model)


def make_backbone(model: torch.nn.Module) -> Backbone:
    """The backbone for a model: Unsloth's (cached on the model, its hooks registered once)
    when ``tarpo.patches`` were applied, else the plain transformers one."""
    from ..patches import BACKEND_MARKER

    base = unwrap(model)
    if getattr(base, BACKEND_MARKER, None) != "unsloth":
        return Backbone(model)
    if base.__dict__.get("_tarpo_backbone") is None:
        base.__dict__["_tarpo_backbone"] = UnslothBackbone(model)
    return base.__dict__["_tarpo_backbone"]
