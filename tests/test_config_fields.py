"""Every field TarpoConfig inherits from TRL works or is pinned to what runs, and a run's saved config is
what ran."""

import dataclasses
import os

import pytest
import torch
from transformers import TrainingArguments
from trl import GRPOConfig

from helpers import loss_of
from tarpo.config import TarpoConfig
from tarpo.trl_fields import HONOURED, INERT, PINNED
from tarpo.training.advantages import group_advantages
from tarpo.training.divergences import k3
from tarpo.training.objective import LossSettings
from tarpo.engine.rollout import RolloutSpec
from tarpo.models.tiny import tiny_causal_lm
from tarpo.training.trainer import TarpoTrainer
from helpers import letter_reward, make_args, make_dataset


def names(cls):
    return {f.name for f in dataclasses.fields(cls)}


GRPO_OWN = names(GRPOConfig) - names(TrainingArguments)

# For each pinned field, a value a user might set that TRL and transformers accept.
OTHER = {
    "router_aux_loss_coef": 0.001, "use_vllm": True,
    "use_transformers_paged": True, "use_transformers_continuous_batching": True,
    "repetition_penalty": 1.1, "cache_implementation": "static", "num_generations_eval": 2,
    "label_smoothing_factor": 0.1,
    "neftune_noise_alpha": 5.0, "include_num_input_tokens_seen": "all", "use_liger_kernel": True,
    "torch_compile": True,
}
# the fields pinned until TarpoTrainer took on GRPOTrainer's contract, honoured since (tests/test_trl_contract.py
# trains with each): the list is shorter
HONOURED_SINCE = {"multi_objective_aggregation", "use_bias_correction_kl", "delta", "off_policy_mask_threshold",
                  "entropy_coef", "sync_ref_model", "min_p", "generation_kwargs", "chat_template_kwargs",
                  "log_completions", "use_adaptive_entropy", "pad_to_multiple_of",
                  "cast_lm_head_to_fp32"}


def test_every_refusal_says_why_and_the_honoured_are_no_longer_refused():
    assert HONOURED_SINCE <= HONOURED and not HONOURED_SINCE & set(PINNED)
    assert all(len(why) > 30 for _, why in PINNED.values())  # a reason, not a word


def test_a_generation_argument_the_decode_loop_does_not_serve_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"^TarpoConfig\.generation_kwargs=.*serves min_p.*not do_sample"):
        make_args(tmp_path, generation_kwargs={"min_p": 0.1, "do_sample": True})


def test_every_field_of_grpo_config_is_honoured_pinned_or_inert():
    pinned = set(PINNED) & GRPO_OWN
    assert not (HONOURED & pinned or HONOURED & set(INERT) or pinned & set(INERT))
    unclassified = GRPO_OWN - HONOURED - pinned - set(INERT)
    assert not unclassified, f"TRL fields with no decision (honoured, pinned or inert): {sorted(unclassified)}"
    assert HONOURED | set(INERT) <= names(GRPOConfig), "a classified field GRPOConfig no longer has"
    assert set(PINNED) <= names(GRPOConfig) and set(OTHER) == set(PINNED)
    defaults = TarpoConfig(output_dir="unused", report_to="none", bf16=False)
    for name, (value, _) in PINNED.items():
        assert getattr(defaults, name) == value, f"{name}: the default is not the pinned value"
    # the paper's values that TarpoConfig sets on inherited fields are read by the trainer
    overridden = {f.name for f in dataclasses.fields(TarpoConfig)
                  if f.name in GRPO_OWN and f.default != GRPOConfig.__dataclass_fields__[f.name].default}
    assert overridden <= HONOURED | set(PINNED), overridden - HONOURED - set(PINNED)


@pytest.mark.parametrize("name", list(PINNED))
def test_a_pinned_field_set_otherwise_is_refused_naming_it(tmp_path, name):
    with pytest.raises(ValueError, match=rf"^TarpoConfig\.{name}=.*TarpoTrainer runs only {PINNED[name][0]!r}"):
        make_args(tmp_path, **{name: OTHER[name]})


@pytest.mark.parametrize("name, value", [("torch_compile_mode", "default"), ("torch_compile_backend", "inductor")])
def test_a_field_that_turns_on_a_pinned_one_is_refused_under_that_name(tmp_path, name, value):
    with pytest.raises(ValueError, match=r"^TarpoConfig\.torch_compile=True: .*torch_compile_backend or"):
        make_args(tmp_path, **{name: value})


def test_the_default_loss_type_and_scale_rewards_are_trls_grpo_and_group():
    """The paper's defaults: tarpo_loss has the gradient of TRL 1.15's loss_type='grpo' (per-sequence mean, then
    batch mean) and group_advantages is scale_rewards='group' (TRL's grpo_trainer.py, the same formulas; every
    loss type against TRL's own code: tests/test_loss_variants.py)."""
    torch.manual_seed(0)
    rewards = torch.rand(8)
    grouped = rewards.view(-1, 4)
    trl_adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
    adv = group_advantages(rewards, 4, eps=1e-4)
    torch.testing.assert_close(adv, trl_adv)

    mask = torch.rand(8, 6) > 0.3
    mask[:, 0] = True
    logp = (-torch.rand(8, 6)).requires_grad_(True)
    ref = -torch.rand(8, 6)
    beta = 0.05
    zeros = torch.zeros(8, 6)
    ours, _ = loss_of(LossSettings(lambda_act=0.1, beta=beta, alpha=1.0, use_router=False), logp_tok=logp,
                         logp_act=zeros, p_hard=torch.ones(8, 6), kl_tok=k3(logp, ref), kl_act=zeros,
                         advantages=adv, completion_mask=mask, is_soft=torch.zeros_like(mask), decided=mask)
    per_token = -torch.exp(logp - logp.detach()) * adv[:, None] + beta * k3(logp, ref)
    trl = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    g_ours, = torch.autograd.grad(ours, logp)
    g_trl, = torch.autograd.grad(trl, logp)
    torch.testing.assert_close(g_ours, g_trl)


@pytest.mark.parametrize("name, value", [("loss_type", "gspo"), ("scale_rewards", "row"),
                                         ("importance_sampling_level", "step"), ("is_correction", "token"),
                                         ("is_clip_max", 0.0), ("epsilon_high", -0.1), ("entropy_soft_when", "mid"),
                                         ("top_entropy_quantile", 1.5), ("top_entropy_quantile", -0.1),
                                         ("sapo_temperature_pos", 0.0), ("sapo_temperature_neg", -1.0)])
def test_a_bad_loss_or_routing_setting_is_refused_naming_it(tmp_path, name, value):
    with pytest.raises(ValueError, match=rf"^TarpoConfig\.{name}="):
        make_args(tmp_path, **{name: value})


def test_the_mismatch_correction_is_refused_where_a_batch_is_reused(tmp_path):
    with pytest.raises(ValueError, match=r"^TarpoConfig\.is_correction='token_mask': corrects on-policy training"):
        make_args(tmp_path, is_correction="token_mask", num_iterations=2)
    with pytest.raises(ValueError, match=r"^TarpoConfig\.is_clip_min=2\.0: must be below is_clip_max=1\.5"):
        make_args(tmp_path, is_clip_min=2.0, is_clip_max=1.5)
    args = make_args(tmp_path, loss_type="dapo", scale_rewards=False, importance_sampling_level="sequence",
                     mask_truncated_completions=True, is_correction="sequence_mask", is_clip_max=None)
    assert (args.loss_type, args.scale_rewards, args.is_clip_max) == ("dapo", "none", None)


@pytest.mark.parametrize("routing", ["soft_tokens", "learned_gumbel"])
@pytest.mark.parametrize("reuse", [dict(num_iterations=2), dict(steps_per_generation=2)],
                         ids=["num_iterations", "steps_per_generation"])
def test_a_routing_that_scores_its_soft_draw_is_refused_wherever_a_batch_is_reused(tmp_path, routing, reuse):
    """Either way of reusing a batch after an optimizer step (several iterations, or a generation batch spanning
    optimizer steps) is off-policy; the check read only num_iterations, and steps_per_generation 2 with one
    accumulation step passed it, then failed at the first loss ("the Soft Tokens term is on-policy only")."""
    name, value = next(iter(reuse.items()))
    with pytest.raises(ValueError, match=rf"^TarpoConfig\.{name}={value}: routing {routing!r} scores its soft"):
        make_args(tmp_path, routing=routing, gradient_accumulation_steps=1, **reuse)
    assert not make_args(tmp_path, routing=routing).off_policy


def test_the_saved_config_of_a_run_is_what_ran(tokenizer, tmp_path):
    args = make_args(tmp_path, routing="hrpo", max_steps=2, save_strategy="steps", save_steps=2, hrpo_lr=1e-2,
                     weight_decay=0.05, adam_beta1=0.8, adam_epsilon=1e-7)
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, seed=2), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    trainer.train()
    saved = torch.load(os.path.join(args.output_dir, "checkpoint-2", "training_args.bin"), weights_only=False)
    assert isinstance(saved, TarpoConfig) and saved.to_dict() == trainer.args.to_dict()
    saved.validate_tarpo()  # the saved config passes the checks a new one does: every pinned field at its value
    for name, (value, _) in PINNED.items():
        assert getattr(saved, name) == value

    # What ran, read from the trainer, against the saved fields
    assert trainer.state.global_step == saved.max_steps == 2
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    kind = {"adamw_torch": ("torch.optim", None), "adamw_bnb_8bit": ("bitsandbytes.optim", 8)}[saved.optim]
    assert type(opt).__name__ == "AdamW" and type(opt).__module__.startswith(kind[0])
    assert getattr(getattr(opt, "args", None), "optim_bits", None) == kind[1]
    groups = opt.param_groups
    assert [g["initial_lr"] for g in groups] == [saved.learning_rate, saved.hrpo_lr, saved.hrpo_lambda_lr]
    assert [g["weight_decay"] for g in groups] == [saved.weight_decay] * 3
    assert all(g["betas"] == (saved.adam_beta1, saved.adam_beta2) and g["eps"] == saved.adam_epsilon for g in groups)
    assert trainer.soft_input.mixture == saved.hrpo_mixture and trainer.soft_input.c == saved.hrpo_c
    assert RolloutSpec.from_config(saved) == RolloutSpec.from_config(trainer.args)
    assert trainer.num_generations == saved.num_generations and trainer.beta == saved.beta
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(h["completions/mean_units"] <= saved.max_completion_length for h in logs)


def test_no_pinned_memory_without_a_gpu(tmp_path):
    """torch warns "'pin_memory' argument is set as true but no accelerator is found" at every CPU run's first
    batch when the Trainer's default (pin) stays on; TarpoConfig turns it off where there is no GPU."""
    import torch

    from tarpo.config import TarpoConfig
    args = TarpoConfig(output_dir=str(tmp_path), report_to="none", bf16=torch.cuda.is_available())
    assert args.dataloader_pin_memory is torch.cuda.is_available()
