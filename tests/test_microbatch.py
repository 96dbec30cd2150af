"""Training in micro-batches gives the gradient of one big batch (docs/memory-plan.md).

TRL decodes ``per_device_train_batch_size * steps_per_generation`` completions at once
(``steps_per_generation`` defaults to ``gradient_accumulation_steps``), shuffles that generation
batch and runs the training forward/backward in micro-batches of ``per_device_train_batch_size``.
The objective is a mean over sequences of per-sequence-normalised sums (docs/algorithm.md §2), and
``TarpoTrainer._compute_loss`` divides each micro-batch's loss by the accumulation steps, so
4 micro-batches of 2 sequences must accumulate the gradient of one batch of 8: here for every
trainable tensor (LoRA, router, HRPO's gate), every routing, and each term of the loss on its own.

Each term is isolated with the loss weights and the reward: the token term with ``lambda_act = beta
= 0``; the router term as the difference ``lambda_act = 1`` minus ``lambda_act = 0`` (the loss is
linear in ``lambda_act``); the KL terms with a constant reward (every advantage 0, so both policy
gradient terms vanish exactly) and ``beta = 1``, the action KL as ``alpha = 1`` minus ``alpha = 0``.
The KL is exactly 0 at initialisation (LoRA B = 0, router = its frozen reference copy), so the
LoRA B matrices and the router are perturbed first, the same way in both runs. The rollout samples
with a bias towards EOS so that the completions differ in length: with equal lengths a per-sequence
normalisation could not be told from one over the batch's tokens.
"""

import datasets
import pytest
import torch
from helpers import BiasedBackbone
from transformers import TrainerCallback

from tarpo.training import objective
from tarpo.training import trainer as trainer_module
from tarpo.config import TarpoConfig
from tarpo.models.tiny import tiny_causal_lm
from tarpo.training.trainer import TarpoTrainer

G = 4            # completions per prompt
PROMPTS = 2      # one generation batch: 2 prompts x 4 completions = 8 rows
BIG, MICRO = (8, 1), (2, 4)  # (per_device_train_batch_size, gradient_accumulation_steps)
EOS_BIAS = 1.5
ROUTINGS = ["learned", "hard", "soft", "entropy", "hrpo", "soft_tokens", "learned_gumbel"]


def letter_reward(prompts, completions, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]


def constant_reward(prompts, completions, **kwargs):
    return [1.0] * len(completions)


class Grads(TrainerCallback):
    """The accumulated gradients just before the optimizer step (clipping is off)."""

    def __init__(self):
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                      for n, p in model.named_parameters() if p.requires_grad}


def perturb(trainer, seed=123):
    """Move the policy away from the reference (LoRA B and the router), identically in every run."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(trainer.model.named_parameters()):
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
        for p in (trainer.router.parameters() if trainer.router is not None else ()):  # routings without one: none
            p.add_(torch.randn(p.shape, generator=g) * 0.5)


def one_step(tokenizer, tmp_path, monkeypatch, routing, shape, reward=letter_reward, **weights):
    per_device, accum = shape
    rollouts, rewards, micro = [], [], []
    generate, score, loss_fn = trainer_module.hybrid_generate, trainer_module.score_rollout, objective.tarpo_loss

    def recording_generate(policy, *args, **kwargs):
        bias = torch.zeros(len(tokenizer))
        bias[tokenizer.eos_token_id] = EOS_BIAS  # the rollout only: lengths that differ
        out = generate(policy._replace(backbone=BiasedBackbone(policy.backbone.model, bias)), *args, **kwargs)
        rollouts.append(out)
        return out

    def recording_score(backbone, router, ref_router, rollout, *args, **kwargs):
        micro.append({"prompt_ids": rollout.prompt_ids, "token_ids": rollout.token_ids})
        return score(backbone, router, ref_router, rollout, *args, **kwargs)

    def recording_loss(settings, scores, batch):
        micro[-1]["advantages"] = batch.advantages.detach().clone()
        loss, terms = loss_fn(settings, scores, batch)
        micro[-1]["terms"] = terms
        return loss, terms

    def recording_reward(prompts, completions, **kwargs):
        out = reward(prompts, completions, **kwargs)
        rewards.append(torch.tensor(letter_reward(prompts, completions) if reward is letter_reward else out))
        return out

    monkeypatch.setattr(trainer_module, "hybrid_generate", recording_generate)
    monkeypatch.setattr(trainer_module, "score_rollout", recording_score)
    monkeypatch.setattr(objective, "tarpo_loss", recording_loss)
    kw = dict(lambda_act=0.0, beta=0.0, alpha_action_kl=0.0)
    kw.update(weights)
    config = TarpoConfig(
        output_dir=str(tmp_path / f"run-{per_device}x{accum}"), bf16=False, use_cpu=True,
        per_device_train_batch_size=per_device, gradient_accumulation_steps=accum, num_generations=G,
        max_completion_length=10, max_steps=1, logging_steps=1, report_to="none", gradient_checkpointing=False,
        save_strategy="no", optim="sgd", learning_rate=1e-2, max_grad_norm=1e9, warmup_steps=0,
        routing=routing, rollout_engine="eager", action_bias=[0.5, 0.0], lora_r=4, lora_alpha=8,
        seed=0, data_seed=0, **kw)
    data = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"question {i}?"}]} for i in range(PROMPTS)])
    recording_reward.__name__ = "reward"
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, "qwen2", seed=0), reward_funcs=recording_reward,
                           args=config, train_dataset=data, processing_class=tokenizer)
    perturb(trainer)
    grads = Grads()
    trainer.add_callback(grads)
    trainer.train()
    monkeypatch.undo()
    return dict(grads=grads.grads, rollouts=rollouts, rewards=rewards, micro=micro)


def check_batching(run, shape):
    """One rollout over the 8 rows; the micro-batches are a shuffle of them, each row with its own
    group's advantage (computed by hand from the rewards, groups = consecutive rows of the rollout)."""
    per_device, accum = shape
    assert len(run["rollouts"]) == 1, "the generation batch was decoded more than once"
    rollout = run["rollouts"][0]
    assert rollout.token_ids.shape[0] == G * PROMPTS
    assert len(set(rollout.units.tolist())) > 2, f"completions of too few lengths: {rollout.units.tolist()}"
    rewards = run["rewards"][0].float()
    expected = []
    for r in range(G * PROMPTS):
        group = rewards[r // G * G:(r // G + 1) * G]
        expected.append(((rewards[r] - group.mean()) / (group.std() + 1e-4)).item())
    assert len(run["micro"]) == accum and all(m["token_ids"].shape[0] == per_device for m in run["micro"])
    order = []
    for m in run["micro"]:
        for i in range(per_device):
            # exact: integer ids
            match = [r for r in range(G * PROMPTS) if torch.equal(rollout.token_ids[r], m["token_ids"][i])
                     and torch.equal(rollout.prompt_ids[r], m["prompt_ids"][i])]  # exact: integer ids
            assert match, "a micro-batch row is not a row of the rollout"
            row = next(r for r in match if r not in order)
            order.append(row)
            assert m["advantages"][i].item() == pytest.approx(expected[row], abs=1e-5)
    assert sorted(order) == list(range(G * PROMPTS)), "the micro-batches do not cover the rollout exactly once"
    return order


def assert_same_grads(big, micro, what):
    assert big.keys() == micro.keys()
    for name in big:
        scale = max(big[name].abs().max().item(), 1e-3)
        torch.testing.assert_close(micro[name], big[name], rtol=0, atol=2e-5 * scale,
                                   msg=lambda m: f"{what}: {name}: {m}")


def group(grads, part):
    return {n: g for n, g in grads.items() if part in n}


def nonzero(grads):
    return max((g.abs().max().item() for g in grads.values()), default=0.0) > 1e-6


def minus(a, b):
    return {n: a[n] - b[n] for n in a}


@pytest.mark.parametrize("routing", ROUTINGS)
def test_micro_batches_accumulate_the_gradient_of_the_whole_batch(tokenizer, tmp_path, monkeypatch, routing):
    def both(**kw):
        runs = [one_step(tokenizer, tmp_path, monkeypatch, routing, shape, **kw) for shape in (BIG, MICRO)]
        big, micro = runs
        # the same rollout: one decode over the same 8 rows in both runs
        for name in ("prompt_ids", "token_ids", "completion_mask", "is_soft", "decided", "soft_ids", "soft_inputs"):
            # exact: one decode of the same 8 rows (one seed, the same shapes) in both runs
            assert torch.equal(getattr(big["rollouts"][0], name), getattr(micro["rollouts"][0], name)), name
        check_batching(big, BIG)
        order = check_batching(micro, MICRO)
        return big, micro, order

    token = both()
    assert_same_grads(token[0]["grads"], token[1]["grads"], "token term")
    assert nonzero(group(token[0]["grads"], "lora_"))
    assert token[2] != list(range(G * PROMPTS)), "TRL did not shuffle the generation batch: the check proves less"
    if routing == "hrpo":
        assert nonzero(group(token[0]["grads"], "tarpo_soft_input"))

    kl = both(reward=constant_reward, beta=1.0)
    # exact: a constant reward 1.0 has mean 1.0 exactly: advantages 0.0
    assert all(m["advantages"].abs().max() == 0 for m in kl[0]["micro"])
    assert all(m["terms"]["kl_tok"] > 0 for m in kl[1]["micro"]), "the policy equals the reference: KL is 0"
    assert_same_grads(kl[0]["grads"], kl[1]["grads"], "token KL term")
    assert nonzero(group(kl[0]["grads"], "lora_"))

    if routing == "learned":
        both_terms = both(lambda_act=1.0)
        act = [minus(both_terms[i]["grads"], token[i]["grads"]) for i in (0, 1)]
        assert nonzero(group(act[0], "tarpo_router"))
        assert_same_grads(act[0], act[1], "router term")

        with_act_kl = both(reward=constant_reward, beta=1.0, alpha_action_kl=1.0)
        act_kl = [minus(with_act_kl[i]["grads"], kl[i]["grads"]) for i in (0, 1)]
        assert nonzero(group(act_kl[0], "tarpo_router"))
        assert_same_grads(act_kl[0], act_kl[1], "action KL term")
