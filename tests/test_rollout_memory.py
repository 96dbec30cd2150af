"""What the eager rollout engine leaves behind and what its decode steps copy (docs/rollout-engines.md).

- Release: once ``hybrid_generate`` returns (or raises), no K/V tensor of the rollout's cache is
  alive: the transformers backend's ``DynamicCache``, and :class:`tarpo.models.backends.UnslothBackbone`'s
  ``_past`` and Unsloth's per-layer paged K/V buffers (here the Unsloth backbone on the
  transformers path, :func:`helpers.stand_in_unsloth_decode`, with Unsloth's buffers stood in by a
  hook; Unsloth itself: tests/test_unsloth_cpu.py). Checked with weak references, without
  ``gc.collect()``: the memory must be free before the training forward, not at some later
  collection.
- Grouped decode attention: with left padding, transformers' SDPA path copies K/V once per query
  head at every decode step (``repeat_kv``); the eager engine's steps go through
  :func:`tarpo.engine.grouped_attention.grouped_decode_attention`, which does not, and decodes the same.
"""

import contextlib
import weakref

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa_attention
from transformers.cache_utils import DynamicLayer

from helpers import policy_of, encode_prompts, stand_in_unsloth_decode
from tarpo.engine import rollout as rollout_module
from tarpo.engine.backbone import Backbone
from tarpo.models.backends import UNSLOTH_DECODE_BUFFERS, make_backbone
from tarpo.engine.rollout import RolloutSpec, hybrid_generate
from tarpo.engine.router import Router

PROMPTS = ["what is 2+3?", "hi", "a longer prompt here"]  # left-padded to the longest


class KVRecorder:
    """Weak references to every K/V tensor a DynamicCache layer holds after an update."""

    def __init__(self, monkeypatch):
        self.refs = []
        update = DynamicLayer.update

        def recording_update(layer, *args, **kwargs):
            out = update(layer, *args, **kwargs)
            self.refs += [weakref.ref(layer.keys), weakref.ref(layer.values)]
            return out
        monkeypatch.setattr(DynamicLayer, "update", recording_update)

    def alive(self):
        return sum(ref() is not None for ref in self.refs)


def decode(backbone, model, tokenizer, steps=8, routing="learned", seed=0):
    torch.manual_seed(0)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0])
    enc = encode_prompts(tokenizer, PROMPTS)
    spec = RolloutSpec(max_new_tokens=steps, temperature=0.8, soft_top_k=5, routing=routing, engine="eager")
    return hybrid_generate(policy_of(backbone, tokenizer, router), enc.input_ids, enc.attention_mask, spec,
                           noise_seed=seed)


class Boom(RuntimeError):
    pass


def failing_at_step(backbone, step):
    """``backbone`` whose logits raise at decode step ``step`` (the cache then holds K/V)."""
    calls = []
    real = backbone.logits

    def logits(hidden):
        calls.append(1)
        if len(calls) == step:
            raise Boom("a decode step failed")
        return real(hidden)
    backbone.logits = logits
    return backbone


def test_the_eager_engine_leaves_no_kv_of_its_cache_alive(model, tokenizer, monkeypatch):
    kv = KVRecorder(monkeypatch)
    out = decode(Backbone(model), model, tokenizer)
    assert out.completion_mask.any() and len(kv.refs) > 4 * model.config.num_hidden_layers
    assert kv.alive() == 0


def test_the_eager_engine_releases_its_cache_when_a_step_fails(model, tokenizer, monkeypatch):
    kv = KVRecorder(monkeypatch)
    with pytest.raises(Boom) as failure:
        decode(failing_at_step(Backbone(model), 4), model, tokenizer)
    assert failure.value.__traceback__ is not None  # the traceback (and the decode frame) is still held here
    assert len(kv.refs) > 0 and kv.alive() == 0


def stand_in_paged_buffers(model):
    """Leave Unsloth-like paged K/V buffers on every attention module at each call, as Unsloth's
    decode attention does (tests/test_unsloth_cpu.py checks Unsloth's own)."""
    refs = []

    def hook(module, args, output):
        module.paged_attention = torch.zeros(16, 2, 3, 2, 16)
        module.paged_attention_K, module.paged_attention_V = module.paged_attention[:, 0], module.paged_attention[:, 1]
        module.temp_QA = torch.zeros(2, 3, 1, 64)
        module.temp_O = module.temp_QA[1]
        refs.extend(weakref.ref(t) for t in (module.paged_attention, module.temp_QA))
    handles = [m.register_forward_hook(hook) for n, m in model.named_modules() if n.endswith("self_attn")]
    return refs, handles


@pytest.mark.parametrize("fail", [False, True], ids=["returns", "raises"])
def test_the_unsloth_backbone_drops_its_past_and_the_paged_buffers_when_a_rollout_ends(model, tokenizer,
                                                                                       monkeypatch, fail):
    stand_in_unsloth_decode(model, monkeypatch)
    backbone = make_backbone(model)
    kv = KVRecorder(monkeypatch)
    paged, handles = stand_in_paged_buffers(model)
    if fail:
        with pytest.raises(Boom):
            decode(failing_at_step(backbone, 4), model, tokenizer)
    else:
        decode(backbone, model, tokenizer)
    for h in handles:
        h.remove()
    assert backbone._past is None and backbone._session is None
    assert len(kv.refs) > 0 and kv.alive() == 0, "the rollout's K/V is still reachable (UnslothBackbone._past)"
    assert paged and all(ref() is None for ref in paged)
    for module in model.modules():
        assert not set(UNSLOTH_DECODE_BUFFERS) & set(vars(module)), type(module).__name__
    # the next rollout prefills afresh and decodes as the first did
    backbone.logits = type(backbone).logits.__get__(backbone)
    a, b = decode(backbone, model, tokenizer, seed=3), decode(backbone, model, tokenizer, seed=3)
    assert torch.equal(a.token_ids, b.token_ids)  # exact: integer ids


# --------------------------------------------------------------------- grouped decode attention
@pytest.mark.parametrize("routing", ["learned", "hard"])
def test_grouped_decode_equals_repeated_heads_on_a_padded_batch(model, tokenizer, monkeypatch, routing):
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert model.config._attn_implementation == "sdpa"
    grouped = decode(Backbone(model), model, tokenizer, steps=24, routing=routing)
    monkeypatch.setattr(rollout_module, "_grouped_attention", lambda backbone: contextlib.nullcontext())
    reference = decode(Backbone(model), model, tokenizer, steps=24, routing=routing)
    assert (reference.prompt_mask == 0).any()
    assert torch.equal(grouped.token_ids, reference.token_ids)  # exact: integer ids
    assert torch.equal(grouped.is_soft, reference.is_soft)  # exact: boolean masks
    torch.testing.assert_close(grouped.logp, reference.logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(grouped.p_soft, reference.p_soft, atol=1e-5, rtol=0)
    assert model.config._attn_implementation == "sdpa"  # restored


def test_a_padded_eager_decode_step_copies_no_kv_per_head(model, tokenizer, monkeypatch):
    """``repeat_kv`` copies K/V per query head; only the prefill (one call per layer) may use it."""
    calls = []
    repeat = sdpa_attention.repeat_kv

    def counting(hidden_states, n_rep):
        if n_rep > 1:
            calls.append(hidden_states.shape[2])
        return repeat(hidden_states, n_rep)
    monkeypatch.setattr(sdpa_attention, "repeat_kv", counting)
    out = decode(Backbone(model), model, tokenizer, steps=6, routing="hard")
    assert out.completion_mask[:, 1:].any()  # decode steps ran
    prompt = encode_prompts(tokenizer, PROMPTS).input_ids.shape[1]
    assert calls == [prompt] * 2 * model.config.num_hidden_layers  # prefill only: K and V, once per layer

