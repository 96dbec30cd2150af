"""Patch: keep the normed final hidden state of Unsloth's fast decode path on the model.

Targets (unsloth 2026.10.7, ``unsloth/models/llama.py``):
- ``LlamaModel_fast_forward_inference(self, input_ids, past_key_values, position_ids,
  attention_mask=None, **kwargs)``, the single-token decode with KV cache that Qwen2 reuses;
  it ends with ``fast_rms_layernorm_inference(self.model.norm, X)`` (a function, so a hook on
  the norm never fires) and returns ``last_hidden_state`` = the ``lm_head`` input, then logits only.
- ``CausalLM_fast_forward(fast_forward_inference)``, which builds the ``*ForCausalLM.forward``
  around that function and keeps it in a closure: re-binding the module global does nothing,
  so the patch builds a new forward from a wrapper and installs it on the model's class. The
  decode it wraps is Unsloth's, built by Unsloth's factory with :mod:`.grouped_decode`'s attention.

Must run after ``FastLanguageModel.from_pretrained`` (its ``pre_patch`` re-binds the class
forward) and before a trainer is built. Sets Unsloth's marker that keeps its GRPO
hidden-state forward wrapper off the instance. After each decode step the hidden state is
``base_model._tarpo_hidden`` [B, 1, d].
"""

from __future__ import annotations

from ..engine.backbone import unwrap
from . import grouped_decode


def apply(model) -> None:
    import unsloth.models.llama as unsloth_llama

    base = unwrap(model)
    cls = type(base)
    if getattr(cls.forward, "_tarpo_decode_hidden", False):
        return
    decode = grouped_decode.decode_function()  # Unsloth's decode, its attention grouped (tarpo.patches.grouped_decode)

    def decode_keeping_hidden(self, input_ids, past_key_values, position_ids, attention_mask=None, **kwargs):
        out = decode(self, input_ids, past_key_values, position_ids, attention_mask=attention_mask, **kwargs)
        self._tarpo_hidden = out.last_hidden_state.clone()  # Unsloth reuses its scratch buffers
        return out

    forward = unsloth_llama.CausalLM_fast_forward(decode_keeping_hidden)
    forward._tarpo_decode_hidden = True
    cls.forward = forward
    base._unsloth_grpo_hidden_states_forward_wrapped = True
