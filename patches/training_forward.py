"""Patch: Unsloth's training forward keeps TARPO's attention mask and input gradients.

Target: ``unsloth.models.llama.LlamaModel_fast_forward(self, input_ids, causal_mask,
attention_mask, position_ids, past_key_values, inputs_embeds, ...)`` (installed as
``Qwen2Model.forward`` / ``LlamaModel.forward``). In training mode it drops the padding mask
unless ``self._unsloth_keep_padding_mask`` is set (wrong for TARPO's left-padded prompts),
and when ``self._has_no_labels`` is set it detaches ``inputs_embeds`` (which would cut the
gradient of HRPO's gate). TARPO calls the decoder without labels; the patch sets the first
flag once and :class:`tarpo.models.backends.UnslothBackbone` clears the second before each call.
:func:`check_target` refuses an Unsloth whose training forward does not read the first (an earlier release
dropped the mask in training whatever was set); the behaviour at the pin: tests/test_unsloth_cpu.py.
"""

from __future__ import annotations

import ast
import textwrap

from ..engine.backbone import unwrap
from .versions import EXPECTED_VERSIONS, PatchError

TARGET = "LlamaModel_fast_forward"
KEEP_MASK = "_unsloth_keep_padding_mask"


def check_target(source: str) -> None:
    """The target reads ``getattr(self, KEEP_MASK, ...)`` (where its training branch decides whether to drop
    the padding mask); else :class:`PatchError` naming it."""
    tree = ast.parse(textwrap.dedent(source))
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "getattr" and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant)
             and n.args[1].value == KEEP_MASK]
    if not reads:
        raise PatchError(f"unsloth/models/llama.py: {TARGET} does not read {KEEP_MASK}: its training forward would "
                         f"drop the padding mask of TARPO's left-padded prompts (tarpo.patches.training_forward "
                         f"expects unsloth=={EXPECTED_VERSIONS['unsloth']})")


def apply(model) -> None:
    base = unwrap(model)
    decoder = base.get_decoder()
    setattr(decoder, KEEP_MASK, True)
    decoder._has_no_labels = False
