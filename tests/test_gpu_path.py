"""The one-GPU path's own code, run on CPU: what Unsloth, bf16 mixed precision and the 8-bit
optimizer change, stood in for where the real thing needs CUDA (docs/gpu-path.md says which).

- the backend marker that ``tarpo.patches.apply`` sets is the one ``make_backbone`` reads,
  also under a PEFT wrapper;
- LoRA gets gradients under re-entrant checkpointing (what Unsloth forces), not only under
  the non-re-entrant kind;
- router and HRPO gate keep fp32 state under bitsandbytes' 8-bit AdamW;
- decode steps do not run through accelerate's fp32-output wrapper of ``model.forward``;
- every rollout runs with the current weights and every step's hidden state is its own.
"""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from helpers import policy_of, encode_prompts, stand_in_unsloth_decode
from tarpo.models.backends import UnslothBackbone, make_backbone
from tarpo.engine.rollout import RolloutSpec, hybrid_generate
from tarpo.engine.router import Router
from tarpo.training.trainer import TarpoTrainer
from helpers import letter_reward, make_args, make_dataset

PROMPTS = ["what is 2+3?", "hi", "a longer prompt here"]


def peft(model):
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))


def rollout(backbone, model, tokenizer, steps=20):
    torch.manual_seed(1)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0])
    enc = encode_prompts(tokenizer, PROMPTS)
    spec = RolloutSpec(max_new_tokens=steps, temperature=0.8, soft_top_k=5, routing="learned")
    return hybrid_generate(policy_of(backbone, tokenizer, router), enc.input_ids, enc.attention_mask, spec)


# --------------------------------------------------------------------- 1. backend marker
def test_patches_apply_marks_the_model_that_make_backbone_reads(model, monkeypatch):
    """``apply`` runs on the PEFT model (after get_peft_model / the adapter); the marker must
    reach ``make_backbone``, which reads the model under the wrapper."""
    import tarpo.patches as patches
    from tarpo.patches import decode_hidden

    model = peft(model)
    monkeypatch.setattr(patches, "check", lambda: None)            # needs Unsloth importable
    monkeypatch.setattr(decode_hidden, "apply", lambda m: None)    # needs Unsloth's decode function
    patches.apply(model)
    backbone = make_backbone(model)
    assert isinstance(backbone, UnslothBackbone), type(backbone).__name__
    assert make_backbone(model.get_base_model()) is backbone
    assert model.get_base_model().get_decoder()._unsloth_keep_padding_mask is True  # training_forward ran


# --------------------------------------------------------------------- 2. re-entrant checkpointing
@pytest.mark.parametrize("routing", ["learned", "hrpo"])
@pytest.mark.parametrize("reentrant", [True, False])
def test_one_step_changes_every_lora_and_router_tensor_under_either_checkpointing(model, tokenizer, tmp_path,
                                                                                  reentrant, routing):
    args = make_args(tmp_path, max_steps=1, gradient_checkpointing=True, routing=routing, warmup_steps=0,
                     lr_scheduler_type="constant", gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    trainer = TarpoTrainer(model=model, reward_funcs=letter_reward, args=args, train_dataset=make_dataset(),
                           processing_class=tokenizer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    layer = trainer.model.get_base_model().get_decoder().layers[0]
    assert layer.gradient_checkpointing and layer._gradient_checkpointing_func.keywords["use_reentrant"] is reentrant
    # exact: any change at all counts as trained
    changed = {n: not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if n in before}
    lora = [n for n in changed if "lora_" in n]
    extra = [n for n in changed if ("tarpo_router" if routing == "learned" else "tarpo_soft_input") in n]
    assert lora and extra and len(lora) + len(extra) == len(changed), sorted(changed)
    assert [n for n in changed if not changed[n]] == []


# --------------------------------------------------------------------- 3. fp32 state under 8-bit AdamW
@pytest.mark.parametrize("routing", ["learned", "hrpo"])
def test_router_and_gate_keep_fp32_state_under_8bit_adamw(tokenizer, tmp_path, routing):
    """Hidden size 2048 (Qwen2.5-3B's): the router weight has 2 x 2048 = 4096 elements, which
    bitsandbytes would quantise (its min_8bit_size is 4096); LoRA tensors stay 8-bit."""
    from tarpo.models.tiny import tiny_causal_lm

    lm = tiny_causal_lm(tokenizer, hidden_size=2048, layers=1, heads=16, kv_heads=2, intermediate_size=64)
    args = make_args(tmp_path, routing=routing, optim="adamw_bnb_8bit")
    trainer = TarpoTrainer(model=lm, reward_funcs=letter_reward, args=args, train_dataset=make_dataset(),
                           processing_class=tokenizer)
    opt = trainer.create_optimizer()
    params = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    for p in params.values():
        p.grad = torch.randn_like(p)
    opt.step()
    state = {n: opt.state[p]["state1"].dtype for n, p in params.items()}
    head = [n for n in state if "tarpo_router" in n or "tarpo_soft_input" in n]
    assert head and all(state[n] == torch.float32 for n in head), {n: state[n] for n in head}
    assert trainer.router.proj.weight.numel() == 4096 if routing == "learned" else trainer.router is None
    assert all(state[n] == torch.uint8 for n in state if "lora_" in n and params[n].numel() >= 4096)


# --------------------------------------------------------------------- 4. no fp32 copies per decode step
def test_decode_steps_skip_accelerates_fp32_output_wrapper(model, tokenizer, monkeypatch):
    """Under bf16 mixed precision accelerate wraps ``model.forward`` on the instance so that every
    output, the KV cache included, is copied to fp32. Unsloth's decode steps must not go through it."""
    import accelerate.utils.operations as ops
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # the Trainers of other tests set fp32
    try:
        model = Accelerator(cpu=True, mixed_precision="bf16").prepare_model(peft(model))
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    calls = []
    real = ops.convert_to_fp32
    monkeypatch.setattr(ops, "convert_to_fp32", lambda tensor: calls.append(1) or real(tensor))
    enc = encode_prompts(tokenizer, PROMPTS)
    model(input_ids=enc.input_ids)
    assert calls, "accelerate did not wrap model.forward: the test does not test anything"
    calls.clear()
    stand_in_unsloth_decode(model, monkeypatch)
    r = rollout(make_backbone(model), model, tokenizer)
    assert r.completion_mask.sum() > len(PROMPTS) and calls == []


# --------------------------------------------------------------------- 5. freshness
def test_a_step_without_its_own_hidden_state_fails_loudly(model, tokenizer, monkeypatch):
    """If the decode patch stops running mid-rollout, the previous step's h_t must not be reused."""
    handle = stand_in_unsloth_decode(model, monkeypatch)
    backbone = make_backbone(model)
    seen = []
    real_logits = backbone.logits

    def logits(hidden):  # drop the hidden-state capture after the third step
        seen.append(1)
        if len(seen) == 3:
            handle.remove()
        return real_logits(hidden)
    backbone.logits = logits
    with pytest.raises(RuntimeError, match="did not leave its hidden state"):
        rollout(backbone, model, tokenizer)


def test_a_dropped_decode_patch_is_refused_at_the_next_rollout(model, tokenizer, monkeypatch):
    from tarpo.patches import PatchError

    plain = type(model).forward
    stand_in_unsloth_decode(model, monkeypatch)
    backbone = make_backbone(model)
    rollout(backbone, model, tokenizer, steps=4)
    monkeypatch.setattr(type(model), "forward", plain)  # a later from_pretrained: Unsloth's pre_patch rebinds it
    with pytest.raises(PatchError, match=r"call tarpo.patches.apply\(model\) again"):
        rollout(backbone, model, tokenizer, steps=4)


def test_a_rollout_drops_unsloths_cached_lora_copies(model, tokenizer, monkeypatch):
    """Unsloth's decode path multiplies by ``lora_A._fast_lora``, a copy made once in the decode
    dtype; after an optimizer step it is stale unless dropped before the next rollout."""
    model = peft(model)
    stand_in_unsloth_decode(model, monkeypatch)
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    for p in lora:
        p._fast_lora = p.detach().to(torch.bfloat16)  # made by an earlier rollout
    with torch.no_grad():
        for p in lora:
            p.add_(1.0)  # an optimizer step
    rollout(make_backbone(model), model, tokenizer, steps=4)
    assert [p for p in lora if hasattr(p, "_fast_lora")] == []


# --------------------------------------------------------------------- 6. precision
@pytest.mark.parametrize("routing", ["learned", "hrpo"])
def test_rollouts_and_training_forwards_run_under_the_weights_autocast(tokenizer, tmp_path, routing):
    """bf16 weights, fp32 LoRA, router and gate, bf16 mixed precision (the launchers' GPU settings): the
    LoRA matmuls of the rollout and of the training forward both run under bf16 autocast, as the Trainer's
    own forward would (the training forward replaces accelerate's autocast wrapper of ``model.forward``);
    the router and the gate stay fp32 inside it (tarpo/engine/precision.py)."""
    from tarpo.models.tiny import tiny_causal_lm

    lm = tiny_causal_lm(tokenizer, "qwen2").to(torch.bfloat16)
    args = make_args(tmp_path, max_steps=1, bf16=True, use_cpu=True, routing=routing)
    trainer = TarpoTrainer(model=lm, reward_funcs=letter_reward, args=args, train_dataset=make_dataset(),
                           processing_class=tokenizer)
    seen = []

    def record(name):
        return lambda module, inputs, output: seen.append(
            (name, torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), output.dtype))
    lora = next(m for n, m in trainer.model.named_modules() if n.endswith("q_proj.lora_A.default"))
    heads = {"router": trainer.router.proj if trainer.router is not None else None,  # HRPO has no router
             "gate": trainer.soft_input.i if trainer.args.rule.soft.trained else None}
    assert lora.weight.dtype == torch.float32
    assert all(m.weight.dtype == torch.float32 for m in heads.values() if m is not None)
    lora.register_forward_hook(record("lora"))
    for name, module in heads.items():
        if module is not None:
            module.register_forward_hook(record(name))
    trainer.train()
    for phase in (False, True):  # the rollout (no grad), the training forward
        lora_calls = {(a, d) for n, g, a, d in seen if n == "lora" and g == phase}
        assert lora_calls == {(True, torch.bfloat16)}, (phase, lora_calls)
        head_calls = {(n, d) for n, g, a, d in seen if n != "lora" and g == phase}
        assert head_calls == {("router" if routing == "learned" else "gate", torch.float32)}, (phase, head_calls)
