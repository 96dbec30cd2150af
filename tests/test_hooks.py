"""The hook mechanism that serves ids-only backends (Unsloth's fast decode) against
passing ``inputs_embeds`` on the transformers path: identical hidden states and rollouts."""

import torch
from peft import LoraConfig, get_peft_model

from helpers import HookedBackbone, policy_of, encode_prompts
from tarpo.engine.backbone import Backbone, positions_from_mask
from tarpo.engine.mixture import build_inputs_embeds, soft_topk
from tarpo.engine.soft_input import TOP_K_MIXTURE
from tarpo.engine.rollout import RolloutSpec, hybrid_generate
from tarpo.engine.router import Router

PROMPTS = ["what is 2+3?", "hi", "a longer prompt here"]


def test_override_and_capture_equal_the_inputs_embeds_path(model, tokenizer):
    enc = encode_prompts(tokenizer, PROMPTS)
    ids, mask = enc.input_ids, enc.attention_mask
    plain, hooked = Backbone(model), HookedBackbone(model)
    E = plain.embed_weight
    # soft mixtures at some positions, placeholders as ids
    torch.manual_seed(0)
    soft = torch.rand(ids.shape) < 0.5
    k_ids, k_w = soft_topk(torch.randn(*ids.shape, E.shape[0]), 5)
    embeds = build_inputs_embeds(E, ids, soft, TOP_K_MIXTURE, dict(soft_ids=k_ids, soft_weights=k_w))
    pos = positions_from_mask(mask)
    with torch.no_grad():
        want = plain.hidden(embeds, mask, pos)
        got = hooked.hidden(embeds, mask, pos, token_ids=ids)
        again = hooked.hidden(E[ids], mask, pos, token_ids=ids)  # the override lasts one call
    # exact: the same decoder kernels on the same embeddings and shapes; only the way in differs
    assert torch.equal(got, want)
    assert torch.equal(again, plain.hidden(E[ids], mask, pos))  # exact: as above, on the token embeddings
    hooked.close()


def _rollout(backbone, model, tokenizer, peft=False):
    torch.manual_seed(1)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0])  # ~50% soft
    enc = encode_prompts(tokenizer, PROMPTS)
    spec = RolloutSpec(max_new_tokens=30, temperature=0.8, soft_top_k=5, routing="learned")
    return hybrid_generate(policy_of(backbone, tokenizer, router), enc.input_ids, enc.attention_mask, spec)


def test_hooked_rollout_equals_the_inputs_embeds_rollout(model, tokenizer):
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             init_lora_weights=False))  # as in training: LoRA active
    a = _rollout(Backbone(model), model, tokenizer)
    hooked = HookedBackbone(model)
    b = _rollout(hooked, model, tokenizer)
    hooked.close()
    assert a.is_soft.any() and (a.completion_mask & ~a.is_soft).any()
    for name in ("token_ids", "completion_mask", "is_soft", "decided", "soft_ids"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name  # exact: integer ids and boolean masks
    torch.testing.assert_close(b.logp, a.logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(b.p_soft, a.p_soft, atol=1e-6, rtol=0)


def test_unsloth_backbone_session_logic_on_the_transformers_path(model, tokenizer, monkeypatch):
    """UnslothBackbone's own logic (prefill through the decoder, steps through the model with
    ids, the cache it passes back, the fixed batch) against the plain rollout. The decode
    wrapper of tarpo.patches is stood in for (helpers.stand_in_unsloth_decode)."""
    from helpers import stand_in_unsloth_decode
    from tarpo.models.backends import UnslothBackbone, make_backbone

    with monkeypatch.context() as patched:
        handle = stand_in_unsloth_decode(model, patched)
        backbone = make_backbone(model)
        assert isinstance(backbone, UnslothBackbone) and make_backbone(model) is backbone  # hooks registered once
        torch.manual_seed(1)
        router = Router(model.config.hidden_size, bias=[0.0, 0.0])
        enc = encode_prompts(tokenizer, PROMPTS)
        spec = RolloutSpec(max_new_tokens=30, temperature=0.8, soft_top_k=5, routing="learned")
        got = hybrid_generate(policy_of(backbone, tokenizer, router), enc.input_ids, enc.attention_mask, spec)
        handle.remove()
        backbone.override.remove()
    torch.manual_seed(1)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0])
    plain = RolloutSpec(max_new_tokens=30, temperature=0.8, soft_top_k=5, routing="learned",
                        compact_finished_rows=False)  # what fixed_batch implies
    want = hybrid_generate(policy_of(Backbone(model), tokenizer, router), enc.input_ids, enc.attention_mask, plain)
    assert got.is_soft.any()
    for name in ("token_ids", "completion_mask", "is_soft"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name  # exact: integer ids and boolean masks
    torch.testing.assert_close(got.logp, want.logp, atol=1e-5, rtol=0)
