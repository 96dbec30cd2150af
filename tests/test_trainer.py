import os

import datasets
import pytest
import torch
from transformers import TrainerCallback

from helpers import letter_reward, make_args, make_dataset
from tarpo.engine.router import Router
from tarpo.training.trainer import TarpoTrainer, encode_prompts


def test_training_changes_every_trainable_parameter_only(model, tokenizer, tmp_path):
    trainer = TarpoTrainer(model=model, reward_funcs=letter_reward, args=make_args(tmp_path),
                           train_dataset=make_dataset(), processing_class=tokenizer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    ref_before = {k: v.clone() for k, v in trainer.ref_router.state_dict().items()}
    trainer.train()
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert any("tarpo_router" in n for n in trainable) and any("lora_" in n for n in trainable)
    for n, p in trainer.model.named_parameters():
        if n in trainable:
            assert not torch.equal(p, before[n]), f"{n} did not change"  # exact: any change at all counts as trained
        else:
            assert torch.equal(p, before[n]), f"frozen {n} changed"  # exact: a frozen tensor is never written
    for k, v in trainer.ref_router.state_dict().items():
        assert torch.equal(v, ref_before[k])  # exact: the reference router is never written
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    # At step 1 the LoRA update is zero and the router is its initial copy: policy == reference.
    assert abs(logs[0]["kl_tok"]) < 1e-6 and abs(logs[0]["kl_act"]) < 1e-6
    assert logs[-1]["kl_act"] > 0
    for key in ["reward", "reward_std", "entropy", "completions/mean_units", "completions/mean_hard_tokens",
                "soft_ratio", "router/p_soft", "loss_tok", "loss_act", "loss_kl", "kl_tok", "kl_act",
                "frac_reward_zero_std"]:
        assert key in logs[0], key
    groups = trainer.optimizer.param_groups
    assert [g["initial_lr"] for g in groups] == [1e-2, 1e-1]
    # Warm-up (10% of 3 steps = 1 step) then cosine: the first logged LR is below the peak.
    assert logs[0]["learning_rate"] < 1e-2
    assert len(groups[1]["params"]) == 2  # router weight and bias


def test_optimizer_is_8bit_adamw_on_cpu(tokenizer, tmp_path):
    import bitsandbytes as bnb

    args = make_args(tmp_path)
    assert str(getattr(args.optim, "value", args.optim)) == "adamw_bnb_8bit"  # paged_adamw_8bit without CUDA
    from tarpo.models.tiny import tiny_causal_lm
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    opt = trainer.create_optimizer()
    assert isinstance(opt, bnb.optim.optimizer.Optimizer8bit)


@pytest.mark.parametrize("routing", ["hard", "soft", "entropy"])
def test_other_routings_train_lora_and_have_no_router(tokenizer, tmp_path, routing):
    from tarpo.models.tiny import tiny_causal_lm
    args = make_args(tmp_path, routing=routing, max_steps=2)
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    assert trainer.router is None and trainer.ref_router is None  # a routing without a router attaches none
    trainer.train()
    assert not any("tarpo_router" in n for n, _ in trainer.model.named_parameters())
    logs = [h for h in trainer.state.log_history if "loss" in h]
    # exact: without a router the action terms are sums of zeros
    assert all(h["loss_act"] == 0 and h["kl_act"] == 0 for h in logs)
    if routing == "hard":
        assert all(h["soft_ratio"] == 0 for h in logs)  # exact: no soft step gives 0 / units = 0.0
    if routing == "soft":
        assert all(h["soft_ratio"] > 0 for h in logs)


def test_checkpoint_resume_continues_the_run_exactly(tokenizer, tmp_path):
    from tarpo.models.tiny import tiny_causal_lm

    class StopAt(TrainerCallback):  # an interrupted run: stops after step 2 of a 4-step schedule
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 2

    def run(max_steps, resume=None, out="a"):
        args = make_args(tmp_path, output_dir=str(tmp_path / out), max_steps=4, save_strategy="steps",
                         save_steps=2, token_kl="full")
        trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, seed=5), reward_funcs=letter_reward, args=args,
                               train_dataset=make_dataset(), processing_class=tokenizer,
                               callbacks=[StopAt()] if max_steps < 4 else None)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(4, out="full")
    run(2, out="part")
    ckpt = tmp_path / "part" / "checkpoint-2"
    assert {"router.safetensors", "adapter_model.safetensors", "optimizer.pt", "scheduler.pt",
            "rng_state.pth"} <= set(os.listdir(ckpt))
    resumed = run(4, resume=str(ckpt), out="part")
    assert resumed.state.global_step == 4
    for (n, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=n)
    torch.testing.assert_close(full.ref_router.proj.weight, resumed.ref_router.proj.weight)
    saved = Router.load(str(tmp_path / "full" / "checkpoint-4"))
    torch.testing.assert_close(saved.proj.weight, full.router.proj.weight.cpu())


def test_bad_input_is_named_before_training(model, tokenizer, tmp_path):
    args = make_args(tmp_path)
    with pytest.raises(ValueError, match="empty"):
        TarpoTrainer(model=model, reward_funcs=letter_reward, args=args,
                     train_dataset=datasets.Dataset.from_list([]), processing_class=tokenizer)
    with pytest.raises(ValueError, match="'prompt'"):
        TarpoTrainer(model=model, reward_funcs=letter_reward, args=args,
                     train_dataset=datasets.Dataset.from_list([{"question": "q"}]), processing_class=tokenizer)


def test_prompts_are_truncated_from_the_left(tokenizer):
    ids, mask, n = encode_prompts(tokenizer, ["abcdefgh", "xy"], max_length=5)
    assert n == 1
    assert tokenizer.decode(ids[0][mask[0].bool()]) == "defgh"
    assert tokenizer.decode(ids[1][mask[1].bool()]) == "xy" and mask[1].tolist() == [0, 0, 0, 1, 1]
    chat, _, _ = encode_prompts(tokenizer, [[{"role": "user", "content": "hi"}]], max_length=100)
    assert tokenizer.decode(chat[0]).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("bad,match", [
    (dict(routing="sometimes"), "routing"),
    (dict(soft_top_k=0), "soft_top_k"),
    (dict(top_k=-1), "top_k"),
    (dict(token_kl="k2"), "token_kl"),
    (dict(action_bias=[1.0]), "action_bias"),
    (dict(per_device_train_batch_size=3, num_generations=4), "divisible by num_generations"),
])
def test_invalid_config_raises_naming_the_field(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        make_args(tmp_path, **bad)


def test_saved_adapter_and_router_load_back(tokenizer, tmp_path):
    from tarpo.models.loading import load_trained
    from tarpo.models.tiny import tiny_causal_lm

    base_dir = tmp_path / "base"
    tiny_causal_lm(tokenizer, "llama", seed=2).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    from transformers import AutoModelForCausalLM
    args = make_args(tmp_path, max_steps=2)
    trainer = TarpoTrainer(model=AutoModelForCausalLM.from_pretrained(base_dir), reward_funcs=letter_reward,
                           args=args, train_dataset=make_dataset(), processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    model, router, tok = load_trained(str(base_dir), str(tmp_path / "final"), dtype="float32")
    torch.testing.assert_close(router.proj.weight, trainer.router.proj.weight)
    torch.testing.assert_close(router.proj.bias, trainer.router.proj.bias)
    trained = dict(trainer.model.named_parameters())
    loaded = dict(model.named_parameters())
    lora = [n for n in trained if "lora_A" in n]
    assert lora
    for n in lora:
        torch.testing.assert_close(loaded[n], trained[n])
    assert tok.padding_side == "left"


def test_passed_peft_model_uses_disabled_adapter_as_reference(tokenizer, tmp_path):
    from peft import get_peft_model

    from tarpo.models.tiny import tiny_causal_lm
    from tarpo.models.loading import lora_config
    args = make_args(tmp_path, max_steps=1)
    peft_model = get_peft_model(tiny_causal_lm(tokenizer), lora_config(args))
    trainer = TarpoTrainer(model=peft_model, reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    assert list(trainer.model.peft_config) == ["default"]
    trainer.train()


def test_a_training_run_compiles_one_decode_graph_whatever_its_prompt_lengths(tokenizer, tmp_path, monkeypatch):
    """Training decodes every batch in the run's shape (prompt budget + completion, generation batch):
    one compiled graph, though each step's prompt has another length (cache buckets of 64 apart)."""
    from torch._dynamo.utils import counters

    from tarpo.training import trainer as trainer_module
    from tarpo.models.tiny import tiny_causal_lm

    torch._dynamo.reset()
    counters.clear()
    lengths = [3, 70, 150]
    dataset = datasets.Dataset.from_list([{"prompt": "q" * n, "answer": "1"} for n in lengths])
    args = make_args(tmp_path, rollout_engine="compiled", max_prompt_length=160, max_steps=3,
                     per_device_train_batch_size=4, num_generations=4, data_seed=1)
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, "qwen2", seed=0), reward_funcs=letter_reward, args=args,
                           train_dataset=dataset, processing_class=tokenizer)
    seen = []
    original = trainer_module.hybrid_generate

    def recording(policy, prompt_ids, prompt_mask, *args, **kwargs):
        seen.append(int(prompt_mask.sum(-1).max()))
        return original(policy, prompt_ids, prompt_mask, *args, **kwargs)
    monkeypatch.setattr(trainer_module, "hybrid_generate", recording)
    trainer.train()
    assert sorted(seen) == lengths, "each step should decode another prompt length"
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("eager_step_s, engine", [(1e-4, "eager"), (10.0, "compiled")])
def test_engine_auto_on_the_cpu_times_the_first_rollout_then_picks_by_cost(tokenizer, tmp_path, monkeypatch,
                                                                           eager_step_s, engine):
    """ENGINE=auto on the CPU: the first rollout runs eagerly and is timed; the others use the engine
    whose cost the remaining decode steps repay (tarpo/engine/engine_choice.py), written down with why."""
    import json

    from tarpo.engine import engine_choice
    from tarpo.training import trainer as trainer_module
    from tarpo.models.tiny import tiny_causal_lm

    args = make_args(tmp_path, rollout_engine="auto", max_steps=3, max_completion_length=8)
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, "qwen2", seed=0), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    engines, original = [], trainer_module.hybrid_generate

    def recording(policy, prompt_ids, prompt_mask, spec, *args, **kwargs):
        engines.append(spec.engine)
        return original(policy, prompt_ids, prompt_mask, spec, *args, **kwargs)
    monkeypatch.setattr(trainer_module, "hybrid_generate", recording)
    from types import SimpleNamespace
    clock = iter(range(0, 10**6))  # each rollout takes 8 * eager_step_s seconds
    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=lambda: next(clock) * 8 * eager_step_s))
    monkeypatch.setattr(engine_choice, "COMPILE_BASE_S", 10.0)
    monkeypatch.setattr(engine_choice, "COMPILE_PER_LAYER_S", 0.0)
    trainer.train()
    assert engines == ["eager", engine, engine]
    decision = json.loads((tmp_path / "run" / "rollout_engine.json").read_text())
    assert decision["requested"] == "auto" and decision["engine"] == engine and "decode steps" in decision["why"]


def test_engine_choice_on_the_cpu_weighs_the_compile_against_the_decode_time_it_saves():
    from tarpo.engine.engine_choice import (CHOICE_MARGIN, COMPILE_BASE_S, COMPILE_PER_LAYER_S, COMPILED_SPEEDUP,
                                            EngineChooser, cpu_choice)

    compile_s = COMPILE_BASE_S + 4 * COMPILE_PER_LAYER_S
    # decode steps of 10 ms that repay the compile CHOICE_MARGIN times over
    breakeven = CHOICE_MARGIN * compile_s / (1 - 1 / COMPILED_SPEEDUP) / 0.01
    assert cpu_choice(4, int(breakeven * 0.99), 0.01)[0] == "eager"
    assert cpu_choice(4, int(breakeven * 1.01) + 1, 0.01)[0] == "compiled"
    chosen = EngineChooser("auto", layers=4)
    assert chosen.next(cuda=True) == "compiled" and chosen.decision["why"] == "CUDA"  # whichever backend
    assert EngineChooser("eager", 4).next(cuda=True) == "eager"
    cpu = EngineChooser("auto", 4)
    assert cpu.next(cuda=False) == "eager" and cpu.decision is None
    assert cpu.observed(seconds=1.0, decode_steps=100, steps_ahead=10**7)["engine"] == "compiled"
    assert cpu.next(cuda=False) == "compiled"


def test_a_cuda_run_logs_its_memory_peaks_scoring_time_and_the_drifts_tails(tokenizer, tmp_path, monkeypatch):
    """What a GPU run logs (tarpo.training.callbacks.StepResources), with CPU stand-ins for CUDA's memory calls: an
    allocator whose peak the rollout raises to 3 GiB and the training forward to 5 GiB, reserved 1 GiB above. The
    rollout's own peak is read just after the rollout (3, not the step's 5), an evaluation's after training too;
    the step's allocated and reserved peaks at its end; ``time_scoring`` times each training forward between two
    synchronisations. Two micro-batches a step: ``logp_drift_max`` logs the step's largest micro-batch maximum,
    ``logp_drift`` their mean."""
    from tarpo.models.tiny import tiny_causal_lm
    from tarpo.training import callbacks, trainer as trainer_module

    peak, syncs, drift_max, drift_mean = [0.0], [], [], []
    monkeypatch.setattr(callbacks, "cuda_in_use", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append(1))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: peak.__setitem__(0, 0.0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: peak[0] * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a, **k: (peak[0] + 1) * 2**30)

    def raising(function, gib):
        def call(*args, **kwargs):
            out = function(*args, **kwargs)
            peak[0] = max(peak[0], gib)
            return out
        return call

    def recording(*args, **kwargs):
        loss, terms = rollout_loss(*args, **kwargs)
        drift_max.append(terms["logp_drift_max"].item())
        drift_mean.append(terms["logp_drift"].item())
        return loss, terms
    rollout_loss = trainer_module.rollout_loss
    monkeypatch.setattr(trainer_module, "hybrid_generate", raising(trainer_module.hybrid_generate, 3.0))
    monkeypatch.setattr(trainer_module, "score_rollout", raising(trainer_module.score_rollout, 5.0))
    monkeypatch.setattr(trainer_module, "rollout_loss", recording)
    args = make_args(tmp_path, max_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                     time_scoring=True, learning_rate=0.3)  # a large step: the second step's drift is not 0
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, "qwen2", seed=0), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and len(drift_max) == 4
    for i, log in enumerate(logs):
        assert log["memory/rollout_peak_gib"] == 3.0 and log["memory/peak_gib"] == 5.0  # exact: the stand-ins' values
        assert log["memory/peak_reserved_gib"] == 6.0  # exact: the stand-ins' values
        assert log["timing/scoring_s"] > 0
        # exact: the maximum of the logged values, each a float the log passes on unchanged
        assert log["logp_drift_max"] == max(drift_max[2 * i:2 * i + 2])
        assert log["logp_drift"] == pytest.approx(sum(drift_mean[2 * i:2 * i + 2]) / 2, rel=1e-6)
        assert 0 <= log["logp_drift_p99"] <= log["logp_drift_max"] and 0 <= log["logp_drift_frac_over_0.1"] <= 1
    assert len(syncs) == 2 * 2 + 2 * 4  # each step's two ends, each training forward's two ends: no other
    # an evaluation after the steps: its rollout's own peak (before: the last training step's 5 GiB, never set back)
    assert trainer.evaluate(make_dataset())["eval_memory/rollout_peak_gib"] == 3.0  # exact: the stand-ins' values
