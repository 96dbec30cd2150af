"""Run-time patches that let the pinned Unsloth serve TARPO (installed as ``tarpo.patches``).

Nothing here edits installed files or copies Unsloth's source. Each patch names the
Unsloth function it relies on (``targets.TARGETS``); :func:`check` verifies the installed
versions and every target's signature first and fails loudly, naming the function and the
expected version, when they do not match.

- :mod:`.decode_hidden`: Unsloth's fast single-token decode (``LlamaModel_fast_forward_inference``,
  reused by Qwen2) returns logits only; the patch re-installs the ``*ForCausalLM.forward`` that
  ``CausalLM_fast_forward`` builds, around a wrapper that keeps the normed final hidden state
  (the ``lm_head`` input) on the model. Soft inputs reach that path through a forward hook on
  ``embed_tokens`` (:class:`tarpo.models.backends.EmbeddingOverride`), which the decode path calls as a
  module: the ids keep flowing.
- :mod:`.grouped_decode`: with a padding mask, Unsloth's decode attention
  (``LlamaAttention_fast_forward_inference``) leaves SDPA only its math kernel, which copies the
  whole K/V cache once per query head every step; the decode that :mod:`.decode_hidden` wraps is
  built with an attention that reads the grouped K/V heads in place.
- :mod:`.training_forward`: ``LlamaModel_fast_forward`` drops the padding mask in training mode
  and may detach ``inputs_embeds``; the patch makes it keep both for TARPO's rebuilt inputs.
- :mod:`.trl_guard`: ``import unsloth`` swaps ``trl.GRPOTrainer`` for a rewritten class whose
  ``compute_loss`` never calls ``_compute_loss``; the guard keeps TARPO on TRL's own class and
  checks that its overrides are the ones that run.

Use: ``tarpo.models.loading`` calls :func:`apply` right after ``FastLanguageModel.get_peft_model``.
"""

from __future__ import annotations

from ..engine.backbone import unwrap
from .targets import check, check_source, check_versions  # noqa: F401
from .versions import EXPECTED_VERSIONS, PatchError  # noqa: F401


BACKEND_MARKER = "_tarpo_backend"


def apply(model) -> None:
    """Check the installed Unsloth, then patch the decode and training forwards for ``model``.

    The backend marker goes on the ``*ForCausalLM`` under any PEFT wrapper, where
    :func:`tarpo.models.backends.make_backbone` reads it: a PEFT wrapper forwards attribute reads to
    the model it wraps, never the other way round.
    """
    from . import decode_hidden, training_forward

    check()
    decode_hidden.apply(model)
    training_forward.apply(model)
    base = unwrap(model)
    setattr(base, BACKEND_MARKER, "unsloth")
