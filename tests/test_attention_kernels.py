"""Every attention call of the training path against CUDA's kernel choice (tests/sdpa_rules.py: torch 2.11 on an
H100, from its source): on the CPU every call runs the CPU kernel, so nothing else here would see a call that
a GPU sends to SDPA's math kernel (fp32 scores per head and query, tens of GB a layer at DAPO's lengths).

The transformers backend here: a TarpoTrainer step (the eager rollout's prefill and decode steps, the
training forward and its recompute under gradient checkpointing) and the compiled engine's decoder
(:func:`tarpo.engine.functional_decoder.forward`, the function its step traces), prefill and decode, run
eagerly so that each call is seen. Unsloth's code under the CPU harness: tests/test_unsloth_trainer.py.
"""

import pytest
import torch
import torch.nn.functional as F

from helpers import letter_reward, make_args, make_dataset
from sdpa_rules import kernel, on_math, recorded_sdpa
from tarpo.training.trainer import TarpoTrainer


def test_the_rule_sends_a_masked_grouped_call_to_math_and_sees_it_in_a_recording():
    """The call Unsloth made before it guarded its dense path (a padding mask and ``enable_gqa``) is a math
    call; the same attention with K/V expanded per query head, or without the mask, is not."""
    q, kv, mask = torch.randn(2, 4, 9, 16), torch.randn(2, 2, 9, 16), torch.ones(2, 1, 9, 9, dtype=torch.bool)
    with recorded_sdpa() as calls:
        F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, enable_gqa=True)  # the unguarded way
        expanded = kv.repeat_interleave(2, dim=1)
        F.scaled_dot_product_attention(q, expanded, expanded, attn_mask=mask)
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True, is_causal=True)
    assert [kernel(c) for c in calls] == ["math", "efficient", "flash"]
    assert on_math(calls) == calls[:1]
    with pytest.raises(ValueError, match="without enable_gqa"):
        kernel(calls[0]._replace(gqa=False))


@pytest.mark.parametrize("routing", ["learned", "hrpo"])
def test_no_attention_call_of_a_training_step_would_run_on_cudas_math_kernel(model, tokenizer, tmp_path, routing):
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped K/V, as Qwen2.5's
    args = make_args(tmp_path, max_steps=1, gradient_checkpointing=True, routing=routing, rollout_engine="eager",
                     gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer = TarpoTrainer(model=model, reward_funcs=letter_reward, args=args, train_dataset=make_dataset(),
                           processing_class=tokenizer)
    with recorded_sdpa() as calls:
        trainer.train()
    # decode steps attend over a longer cache (their query heads may be folded by group along the query axis:
    # tarpo.engine.grouped_attention); the prefill and the training forward over their own positions
    decode = [c for c in calls if c.query[2] < c.key[2]]
    training = [c for c in calls if c.requires_grad]
    prefill = [c for c in calls if c.query[2] == c.key[2] and not c.requires_grad]
    assert decode and training and prefill, calls
    assert on_math(calls) == [], on_math(calls)


def test_the_compiled_engines_decoder_would_run_no_call_on_cudas_math_kernel(model, tokenizer):
    from tarpo.engine import decoder_tensors, functional_decoder as fd
    from tarpo.engine.backbone import Backbone, positions_from_mask

    backbone, weights = Backbone(model), decoder_tensors.build(model)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, :4] = 0  # a left-padded row
    cache = fd.new_cache(weights, 3, 16, torch.float32, "cpu")
    with torch.no_grad(), recorded_sdpa() as calls:
        fd.forward(weights, backbone.embed_weight[torch.randint(3, 50, (3, 10))], positions_from_mask(mask), cache,
                   torch.arange(10), fd.prefill_mask(mask), 10)
        step_mask = torch.cat([mask, torch.ones(3, 6, dtype=torch.long)], 1)
        fd.forward(weights, backbone.embed_weight[torch.randint(3, 50, (3, 1))], positions_from_mask(mask)[:, -1:] + 1,
                   cache, torch.tensor([10]), fd.decode_mask(step_mask, torch.tensor(10)))
    layers = len(weights.layers)  # one call a layer; the decode step's query heads folded by group (query axis)
    assert len(calls) == 2 * layers and all(c.query[2] == c.key[2] == 10 for c in calls[:layers]), calls
    assert all(c.query[2] < c.key[2] == 16 for c in calls[layers:]), calls
    assert on_math(calls) == [], on_math(calls)
