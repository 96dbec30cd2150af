"""A non-finite step never reaches the parameters (tarpo.training.nonfinite): a training forward turned NaN (as a bf16
overflow would turn it) is skipped and counted, NaN at every step stops the run with one line, a rollout's NaN is
caught the same way, and no save writes a non-finite tensor."""

import json
import math

import pytest
import torch

from helpers import letter_reward, make_args, make_dataset
from tarpo.models.tiny import tiny_causal_lm
from tarpo.training import trainer as trainer_module
from tarpo.training.trainer import TarpoTrainer


def nan_forwards(monkeypatch, which):
    """The training forwards (score_rollout calls) whose numbers are in ``which`` (1-based; None: every one) return
    NaN log-probabilities of the tokens: the logits turned NaN, with the gradient that follows from them."""
    calls, score = [0], trainer_module.score_rollout

    def scoring(*args, **kwargs):
        scores = score(*args, **kwargs)
        calls[0] += 1
        if which is None or calls[0] in which:
            scores.logp_tok = scores.logp_tok * float("nan")
        return scores
    monkeypatch.setattr(trainer_module, "score_rollout", scoring)
    return calls


def at_step_end(monkeypatch, trainer, record):
    """Call ``record()`` at the end of every optimizer step (before the Trainer's own step-end callbacks)."""
    handler = trainer.callback_handler
    original = handler.on_step_end
    monkeypatch.setattr(handler, "on_step_end", lambda args, state, control: (record(), original(args, state,
                                                                                                 control))[1])


def trainer_of(tokenizer, tmp_path, **overrides):
    settings = dict(max_steps=4, per_device_train_batch_size=2, gradient_accumulation_steps=2)  # 2 micro-batches
    args = make_args(tmp_path, **{**settings, **overrides})
    return TarpoTrainer(model=tiny_causal_lm(tokenizer, "qwen2", seed=0), reward_funcs=letter_reward, args=args,
                        train_dataset=make_dataset(), processing_class=tokenizer)


def test_one_nan_training_forward_skips_its_step_and_every_trained_tensor_stays_finite(tokenizer, tmp_path,
                                                                                       monkeypatch):
    """The 2nd of 8 training forwards (step 1's second micro-batch) turns NaN. Before the guard the optimizer stepped
    on NaN gradients: 18 trained tensors NaN, the run went on, and every later loss was logged as 0.0."""
    from tarpo.training.callbacks import JsonlLogger

    calls = nan_forwards(monkeypatch, {2})
    trainer = trainer_of(tokenizer, tmp_path)
    trainer.add_callback(JsonlLogger(str(tmp_path / "metrics.jsonl")))
    trained = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    start = {n: p.detach().clone() for n, p in trained.items()}
    rates = []
    at_step_end(monkeypatch, trainer, lambda: rates.append(trainer.optimizer.param_groups[0]["lr"]))
    result = trainer.train()
    # the run's loss is finite, and its metrics log is strict JSON: the skipped step's loss is null there
    assert math.isfinite(result.training_loss)

    def refuse(constant):
        raise ValueError(f"{constant} in metrics.jsonl")
    records = [json.loads(line, parse_constant=refuse) for line in open(tmp_path / "metrics.jsonl")]
    assert records[0]["loss"] is None and records[0]["nonfinite_steps"] == 1
    assert math.isfinite(records[-1]["train_loss"])
    assert calls[0] == 8
    assert all(torch.isfinite(p).all() for p in trained.values())
    assert all(not torch.equal(trained[n], start[n]) for n in trained)  # exact: steps 2-4 trained every tensor
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert [h["nonfinite_steps"] for h in logs] == [1, 1, 1, 1]
    assert math.isnan(logs[0]["loss"]) and all(math.isfinite(h["loss"]) and h["loss"] != 0 for h in logs[1:])
    assert math.isnan(logs[0]["grad_norm"])
    # exact: the skipped step did not advance the schedule (a warm-up of 1 step from 0, then cosine from 1e-2): the
    # rate after step 1 is still the warm-up's first, where an unskipped run would be at the peak after one step
    assert rates[:2] == [0.0, 1e-2]


def test_one_nan_step_leaves_the_parameters_and_the_optimizer_as_they_were(tokenizer, tmp_path, monkeypatch):
    """The skipped step changes no parameter and no optimizer state: the run with step 1 skipped ends where one
    update from the same start with step 2's gradients ends, made by a fresh optimizer of the same kind and
    settings (a step 1 that had written anything, its moments or its step count, would move that end)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    nan_forwards(monkeypatch, {1})
    skipped = trainer_of(tokenizer, tmp_path / "a", max_steps=2, lr_scheduler_type="constant", warmup_steps=0)
    trained = {n: p for n, p in skipped.model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in trained.items()}
    seen, grads = [], []
    at_step_end(monkeypatch, skipped, lambda: seen.append({n: p.detach().clone() for n, p in trained.items()}))
    hook = register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: grads.append(
        {n: None if p.grad is None else p.grad.clone() for n, p in trained.items()}))
    try:
        skipped.train()
    finally:
        hook.remove()
    # exact: a skipped step writes nothing
    assert all(torch.equal(seen[0][n], before[n]) for n in before)
    # exact: any change at all counts as trained
    assert all(not torch.equal(seen[1][n], before[n]) for n in before)
    state = skipped.optimizer.state
    assert state and all(int(s["step"]) == 1 for s in state.values())  # one update, not two
    # the same end from one update of a fresh optimizer with step 2's gradients
    optimizer = skipped.optimizer.optimizer if hasattr(skipped.optimizer, "optimizer") else skipped.optimizer
    index = {id(p): n for n, p in trained.items()}
    start = {n: before[n].clone().requires_grad_(True) for n in before}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [start[index[id(p)]] for p in g["params"]]}
              for g in optimizer.param_groups]
    fresh = type(optimizer)(groups)
    last = grads[-1]
    assert all(g is not None for g in last.values())
    for n, p in start.items():
        p.grad = last[n]
    fresh.step()
    for n in before:  # tolerance: the same optimizer on the same numbers; 1e-7 for a fused or foreach kernel's order
        torch.testing.assert_close(start[n].detach(), seen[1][n], rtol=0, atol=1e-7)


def test_a_nan_evaluation_forward_neither_skips_nor_counts_a_training_step(tokenizer, tmp_path, monkeypatch):
    """Only training losses decide a step: evaluation after step 1 (its forwards NaN) leaves step 2 to train."""
    calls, score = [], trainer_module.score_rollout

    def scoring(*args, **kwargs):
        scores = score(*args, **kwargs)
        calls.append(torch.is_grad_enabled())
        if not torch.is_grad_enabled():  # the evaluation's forwards
            scores.logp_tok = scores.logp_tok * float("nan")
        return scores
    monkeypatch.setattr(trainer_module, "score_rollout", scoring)
    args = make_args(tmp_path, max_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                     eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4)
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, "qwen2", seed=0), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), eval_dataset=make_dataset(4), processing_class=tokenizer)
    trainer.train()
    assert False in calls  # an evaluation ran, NaN
    logs = [h for h in trainer.state.log_history if "reward" in h and "loss" in h]
    assert [h["nonfinite_steps"] for h in logs] == [0, 0] and all(math.isfinite(h["loss"]) for h in logs)


def test_nan_at_every_step_stops_the_run_naming_the_step_and_the_last_checkpoint(tokenizer, tmp_path, monkeypatch):
    from tarpo.training.nonfinite import NonFiniteTraining

    nan_forwards(monkeypatch, None)
    trainer = trainer_of(tokenizer, tmp_path, max_steps=6, max_nonfinite_steps=3)
    with pytest.raises(NonFiniteTraining) as err:
        trainer.train()
    message = str(err.value)
    assert "\n" not in message and message.startswith("step 3: ") and "3 optimizer steps in a row" in message
    assert "the last complete checkpoint is none" in message and "learning rate" in message
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_a_nan_router_probability_in_the_rollout_routes_hard_and_trains(tokenizer, tmp_path, monkeypatch):
    """The rollout filters nothing. A router that returns NaN in the first rollout (as an overflow of the policy's
    arithmetic would) draws no soft step there (``u < NaN`` is false) and records NaN; the training forward
    recomputes the router from its finite parameters, so that step trains as usual."""
    from tarpo.engine.router import Router

    log_probs = Router.log_probs

    def router(self, h):
        out = log_probs(self, h)
        return out * float("nan") if not torch.is_grad_enabled() and rollouts[0] == 1 else out
    rollouts, generate = [0], trainer_module.hybrid_generate

    def counting(*args, **kwargs):
        rollouts[0] += 1
        return generate(*args, **kwargs)
    monkeypatch.setattr(Router, "log_probs", router)
    monkeypatch.setattr(trainer_module, "hybrid_generate", counting)
    trainer = trainer_of(tokenizer, tmp_path, max_steps=2)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert logs[0]["soft_ratio"] == 0 and logs[1]["soft_ratio"] > 0  # exact: no soft step gives 0 / units = 0.0
    assert [h["nonfinite_steps"] for h in logs] == [0, 0] and all(math.isfinite(h["loss"]) for h in logs)


def test_a_nan_soft_mixture_in_the_rollout_is_caught_at_its_step(tokenizer, tmp_path, monkeypatch):
    """A rollout whose recorded soft mixture is NaN (its logits overflowed at a soft step): the training forward
    rebuilds those inputs, its log-probabilities are NaN, and the step is skipped and counted; the run goes on."""
    generate, calls = trainer_module.hybrid_generate, [0]

    def poisoned(*args, **kwargs):
        rollout = generate(*args, **kwargs)
        calls[0] += 1
        if calls[0] == 1:
            assert rollout.is_soft.any()
            rollout.soft_weights.mul_(float("nan"))
        return rollout
    monkeypatch.setattr(trainer_module, "hybrid_generate", poisoned)
    trainer = trainer_of(tokenizer, tmp_path, max_steps=2)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert [h["nonfinite_steps"] for h in logs] == [1, 1] and math.isnan(logs[0]["loss"])
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_no_checkpoint_or_adapter_is_written_with_a_non_finite_tensor(tokenizer, tmp_path):
    from tarpo.training.checkpoints import NonFiniteTensors

    trainer = trainer_of(tokenizer, tmp_path, max_steps=1)
    lora = next(p for n, p in trainer.model.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        lora[0, 0] = float("inf")
    with pytest.raises(NonFiniteTensors, match="refusing to save .*adapter: 1 trained tensor"):
        trainer.save_model(str(tmp_path / "adapter"))
    assert not (tmp_path / "adapter").exists()


def test_the_guard_reads_the_device_once_a_step_and_never_per_micro_batch(tokenizer, tmp_path):
    """Each micro-batch's loss is checked on the device; the step's verdict is one host read at the optimizer step
    (tests/syncs.py counts on the CPU what would make the host wait for a GPU). 4 steps of 2 micro-batches: 4 reads."""
    from syncs import HostSyncs

    trainer = trainer_of(tokenizer, tmp_path)
    with HostSyncs() as syncs:
        trainer.train()
    guard = {where: n for where, n in syncs.where.items() if "nonfinite.py" in where}
    assert sum(guard.values()) == 4 and len(guard) == 1, guard


def test_a_steps_host_reads_do_not_grow_with_its_micro_batches(tokenizer, tmp_path):
    """The whole training step's host reads in the training code (tarpo/training/, tarpo/losses.py: the rollout's
    metrics, the loss, its figures, the guard) are the same for a step of 2 micro-batches of 4 rows and one of 4
    micro-batches of 2, but for the training forward's selection of its completion steps: the loss's figures (drift
    tails, kl, clip ratios, the objective's terms) are read once a step (metrics.LossFigures), none per
    micro-batch (before: one read a figure a micro-batch, 60 more here)."""
    from syncs import HostSyncs

    counts = {}
    for rows, accumulation in ((4, 2), (2, 4)):
        trainer = trainer_of(tokenizer, tmp_path / str(rows), max_steps=2, per_device_train_batch_size=rows,
                             gradient_accumulation_steps=accumulation)
        with HostSyncs() as syncs:
            trainer.train()
        counts[accumulation] = {w: n for w, n in syncs.where.items() if "training/" in w or "losses.py" in w}
        assert sum("logp_drift_p99" in h for h in trainer.state.log_history) == 2  # one a step
    grown = {w: (n, counts[2].get(w)) for w, n in counts[4].items() if n != counts[2].get(w)}
    # what does grow: the training forward's selection of the completion steps (training/scoring.py), which runs
    # the vocabulary-wide head over those steps only (a read a micro-batch that saves the padding's products)
    assert grown and all("training/scoring.py" in w for w in grown), grown
