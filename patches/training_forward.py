"""Patch: Unsloth's training forward keeps TARPO's attention mask and input gradients.

Target: ``unsloth.models.llama.LlamaModel_fast_forward(self, input_ids, causal_mask,
attention_mask, position_ids, past_key_values, inputs_embeds, ...)`` (installed as
``Qwen2Model.forward`` / ``LlamaModel.forward``). In training mode it drops the padding mask
unless ``self._unsloth_keep_padding_mask`` is set (wrong for TARPO's left-padded prompts),
and when ``self._has_no_labels`` is set it detaches ``inputs_embeds`` (which would cut the
gradient of HRPO's gate). TARPO calls the decoder without labels; the patch sets the first
flag once and :class:`tarpo.models.backends.UnslothBackbone` clears the second before each call.
"""

from __future__ import annotations

from ..engine.backbone import unwrap


def apply(model) -> None:
    base = unwrap(model)
    decoder = base.get_decoder()
    decoder._unsloth_keep_padding_mask = True
    decoder._has_no_labels = False
