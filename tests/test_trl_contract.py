"""TarpoTrainer keeps GRPOTrainer's contract (tarpo/training/trl_contract.py, docs/design-notes.md "TRL's contract"):
driven the way TRL's own GRPO trainer tests drive GRPOTrainer (a model folder given by name, no tokenizer, standard,
conversational and streaming data sets, TRL's options, evaluation), with TRL's default values for every field whose
default TarpoConfig changes, plain GRPO routing; each training scenario changes every trainable parameter."""

import dataclasses
import json
import math
import os
import shutil

import datasets
import pytest
import torch
from trl import GRPOConfig

from tarpo.config import TarpoConfig
from tarpo.models.tiny import char_tokenizer, tiny_causal_lm
from tarpo.training.trainer import TarpoTrainer

SIZES = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=2,
             report_to="none", save_strategy="no", logging_steps=1, bf16=False)  # what TRL's CPU tests set too


def trl_defaults() -> dict:
    """GRPOConfig's default of every field whose default TarpoConfig changes (docs/design-notes.md's table)."""
    trl, ours = GRPOConfig.__dataclass_fields__, TarpoConfig.__dataclass_fields__
    out = {}
    for name, f in trl.items():
        if not f.init or name not in ours:
            continue
        theirs = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        mine = ours[name]
        mine = mine.default_factory() if mine.default_factory is not dataclasses.MISSING else mine.default
        if theirs != mine:
            out[name] = theirs
    return out


def test_the_fields_whose_defaults_differ_are_the_documented_ones():
    """Each is in docs/design-notes.md's table of changed defaults, with TRL's value beside ours."""
    import os
    doc = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                            "design-notes.md")).read()
    table = doc[doc.index("| field | TRL's GRPOConfig | TarpoConfig |"):]
    table = table[:table.index("\n\n")]
    assert set(trl_defaults()) == {line.split("`")[1] for line in table.splitlines()[2:]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    tok = char_tokenizer()
    tiny_causal_lm(tok, "qwen2", seed=0).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def codes(prompts, completions, **kwargs):
    """A reward with spread in every group (a random model's completions): their character codes' sum mod 7."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(map(ord, t)) % 7 / 7 for t in texts]


def length(prompts, completions, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [len(t) / 10 for t in texts]


def standard(n=8):
    return datasets.Dataset.from_list([{"prompt": f"question {i} is"} for i in range(n)])


def conversational(n=8):
    return datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": f"question {i}?"}]} for i in range(n)])


def config(tmp_path, **fields):
    return TarpoConfig(output_dir=str(tmp_path / "run"), routing="hard", **{**trl_defaults(), **SIZES, **fields})


def trains_every_parameter(trainer):
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    # exact: any change at all counts as trained
    unchanged = [n for n, p in before.items() if torch.equal(p, after[n])]
    assert before and unchanged == [], unchanged[:5]
    return [h for h in trainer.state.log_history if "loss" in h]


LR = dict(learning_rate=0.02)  # steps large enough that a clip, a mask or a correction of the ratio binds
SCENARIOS = {
    "standard": {}, "conversational": {}, "full-fine-tuning": dict(use_peft=False),
    "min_p": dict(min_p=0.95), "generation_kwargs": dict(generation_kwargs={"min_p": 0.95}),
    "chat_template_kwargs": dict(chat_template_kwargs={"shout": True}),
    "normalize_then_sum": dict(multi_objective_aggregation="normalize_then_sum"),
    "delta": dict(delta=1.01, num_iterations=2, **LR),
    "off_policy_mask": dict(off_policy_mask_threshold=1e-6, num_iterations=2, **LR),
    "bias_correction_kl": dict(beta=0.04, use_bias_correction_kl=True, **LR), "entropy_coef": dict(entropy_coef=0.01),
    "luspo": dict(loss_type="luspo"), "vespo": dict(loss_type="vespo", num_iterations=2, **LR),
    "log_completions": dict(log_completions=True), "sync_ref_model": dict(use_peft=False, beta=0.04,
                                                                          sync_ref_model=True, ref_model_sync_steps=1),
}
# the run each scenario's option is compared with: the same settings without it (absent: the option changes what is
# logged or the set of trained tensors, checked below, not the training of the same tensors)
BASELINES = {"min_p": {}, "generation_kwargs": {}, "chat_template_kwargs": {}, "normalize_then_sum": {},
             "delta": dict(num_iterations=2, **LR), "off_policy_mask": dict(num_iterations=2, **LR),
             "bias_correction_kl": dict(beta=0.04, use_bias_correction_kl=False, **LR),  # TRL's default is on
             "entropy_coef": {}, "luspo": {}, "vespo": dict(num_iterations=2, **LR)}


def trained_end(trainer) -> dict:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def shouting_tokenizer(model_dir):
    """The model's tokenizer with a chat template that reads a template argument (``shout``)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if shout %}!{% endif %}"
    return tok


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_trl_training_scenario_trains_every_parameter(model_dir, tmp_path, scenario):
    """The model given by its folder's name and no processing_class (TRL loads both), TRL's defaults, two reward
    functions; each scenario one of TRL's fields this trainer now honours, and each field acts: the run ends
    elsewhere than the same run without it (an ignored option would end at the same parameters)."""
    data = conversational() if scenario in ("conversational", "chat_template_kwargs") else standard()
    args = config(tmp_path, **SCENARIOS[scenario])
    tok = shouting_tokenizer(model_dir) if scenario == "chat_template_kwargs" else None
    trainer = TarpoTrainer(model_dir, [codes, length], args=args, train_dataset=data, processing_class=tok)
    logs = trains_every_parameter(trainer)
    if scenario in BASELINES:
        baseline = TarpoTrainer(model_dir, [codes, length], args=config(tmp_path / "base", **BASELINES[scenario]),
                                train_dataset=data, processing_class=tok)
        baseline.train()
        end, other = trained_end(trainer), trained_end(baseline)
        # exact: any difference at all shows the option acted
        assert any(not torch.equal(end[n], other[n]) for n in end), f"{scenario}: the same end without it"
    ratio = "vespo/phi_seq_mean" if args.loss_type == "vespo" else "clip_ratio/region_mean"
    assert len(logs) == 2 and {"completions/mean_length", "completions/max_terminated_length", "rewards/codes/std",
                               ratio} <= set(logs[0])
    if args.beta:
        assert "kl" in logs[0]
    if scenario == "full-fine-tuning":
        assert not any("lora_" in n for n, _ in trainer.model.named_parameters())
    if scenario == "log_completions":  # TRL's log keeps the last generation batch
        assert len(trainer._logs["completion"]) == args.generation_batch_size
        assert set(trainer._logs["rewards"]) == {"codes", "length"}


def test_the_entropy_bonus_trains_and_is_logged_as_trls(model_dir, tmp_path):
    """``entropy_coef`` changes the gradient, not only the logged loss (the entropy keeps its gradient, as TRL's
    does): one SGD step from the same start and data moves the adapter otherwise than with the bonus off. Logged as
    TRL logs it: ``policy_loss``, ``entropy_coef``, and ``loss`` = ``policy_loss`` - coef x the entropy."""
    adapters = {}
    for coef in (0.0, 0.5):
        args = config(tmp_path / str(coef), entropy_coef=coef, max_steps=1, optim="sgd", learning_rate=0.1,
                      lr_scheduler_type="constant", warmup_steps=0, use_vllm=False)
        trainer = TarpoTrainer(model_dir, codes, args=args, train_dataset=standard())
        trainer.train()
        adapters[coef] = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
        (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert log["entropy_coef"] == 0.5 and "policy_loss" in log
    assert math.isclose(log["loss"], log["policy_loss"] - 0.5 * log["entropy_bonus"], rel_tol=1e-4, abs_tol=1e-6)
    moved = max((adapters[0.5][n] - adapters[0.0][n]).abs().max().item() for n in adapters[0.0])
    assert moved > 1e-4, moved


def adapter_at(folder) -> dict:
    from safetensors.torch import load_file
    return load_file(os.path.join(folder, "adapter_model.safetensors"))


def test_adaptive_entropy_moves_the_coefficient_as_trls_controller_and_resumes(model_dir, tmp_path):
    """``use_adaptive_entropy`` (TRL's controller, tarpo/training/trainer_entropy.py): with a target above any entropy
    the coefficient rises by ``entropy_coef_delta`` at each step up to ``entropy_coef_max`` (logged 0.5, 0.8, 0.8).
    Step 1 applies 0 (no step measured yet), so after it the run is where the run without the controller is; step 2
    applies 0.5 and moves elsewhere. Each checkpoint keeps the controller's state in TRL's file, and a run resumed at
    step 2 applies and logs what the uninterrupted run did (a resume that forgot it would log 0.5 at step 3)."""
    common = dict(max_steps=3, optim="sgd", learning_rate=0.1, lr_scheduler_type="constant", warmup_steps=0,
                  save_strategy="steps", save_steps=1)
    adaptive = dict(use_adaptive_entropy=True, entropy_coef=0.0, entropy_coef_delta=0.5, entropy_coef_max=0.8,
                    entropy_target=1e9)
    runs = {}
    for name, extra in (("adaptive", adaptive), ("without", {})):
        trainer = TarpoTrainer(model_dir, codes, args=config(tmp_path / name, **common, **extra),
                               train_dataset=standard())
        trainer.train()
        runs[name] = trainer
    logs = [h for h in runs["adaptive"].state.log_history if "loss" in h]
    assert [h["entropy_coef"] for h in logs] == [0.5, 0.8, 0.8]
    run = {name: str(tmp_path / name / "run") for name in runs}
    one = {name: adapter_at(os.path.join(run[name], "checkpoint-1")) for name in runs}
    two = {name: adapter_at(os.path.join(run[name], "checkpoint-2")) for name in runs}
    for n in one["without"]:  # tolerance: the same kernels; the entropy's extra outputs may reorder nothing else
        torch.testing.assert_close(one["adaptive"][n], one["without"][n], rtol=0, atol=1e-6)
    assert max((two["adaptive"][n] - two["without"][n]).abs().max().item() for n in two["without"]) > 1e-4
    with open(os.path.join(run["adaptive"], "checkpoint-2", "entropy_ctrl_state.json")) as f:
        assert json.load(f)["entropy_coef"] == 0.8
    resumed = TarpoTrainer(model_dir, codes, args=config(tmp_path / "adaptive", **common, **adaptive),
                           train_dataset=standard())
    shutil.rmtree(os.path.join(run["adaptive"], "checkpoint-3"))
    resumed.train(resume_from_checkpoint=os.path.join(run["adaptive"], "checkpoint-2"))
    assert [h for h in resumed.state.log_history if "loss" in h][-1]["entropy_coef"] == 0.8
    end = trained_end(runs["adaptive"])
    for n, p in trained_end(resumed).items():  # tolerance: a resumed step replays the same kernels and RNG state
        torch.testing.assert_close(p, end[n], rtol=0, atol=1e-6)


def test_a_resume_outside_trls_optimizer_loader_reads_the_adaptive_entropy_state(tmp_path):
    """CPU processes under DDP load the optimizer with their own loader (tarpo/training/resume.py), which TRL's
    reading of ``entropy_ctrl_state.json`` does not run beside: the trainer reads it itself."""
    from types import SimpleNamespace
    from tarpo.training.trainer_entropy import TrainerEntropy
    (tmp_path / "entropy_ctrl_state.json").write_text(json.dumps({"entropy_coef": 0.3, "last_world_entropy": 1.5}))
    trainer = SimpleNamespace(use_adaptive_entropy=True, entropy_coef=0.0, _last_world_entropy=float("inf"))
    TrainerEntropy._restore_entropy_control(trainer, str(tmp_path))
    assert (trainer.entropy_coef, trainer._last_world_entropy) == (0.3, 1.5)


def test_pad_to_multiple_of_sets_the_training_forwards_lengths_and_changes_no_score(model_dir, tmp_path):
    """TRL's ``pad_to_multiple_of``: the training forward runs prompt + completion lengths that are multiples of it
    (prompt padded on the left, steps on the right), and one SGD step ends where the unpadded run does (the padding is
    masked)."""
    ends, lengths = {}, {}
    for multiple in (None, 16):
        args = config(tmp_path / str(multiple), pad_to_multiple_of=multiple, max_steps=1, optim="sgd",
                      learning_rate=0.1, lr_scheduler_type="constant", warmup_steps=0)
        trainer = TarpoTrainer(model_dir, codes, args=args, train_dataset=standard())
        seen = lengths[multiple] = []
        decoder = trainer.model.get_base_model().get_decoder()
        decoder.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["inputs_embeds"].shape[1])
                                          if torch.is_grad_enabled() else None, with_kwargs=True)
        trainer.train()
        ends[multiple] = trained_end(trainer)
    assert lengths[16] and all(n % 16 == 0 for n in lengths[16]) and any(n % 16 for n in lengths[None]), lengths
    for n, p in ends[16].items():  # tolerance: other matmul shapes, the same masked sums
        torch.testing.assert_close(p, ends[None][n], rtol=0, atol=1e-5)


def test_cast_lm_head_to_fp32_computes_the_logits_in_fp32_in_rollout_and_training(model_dir, tmp_path):
    """TRL's ``cast_lm_head_to_fp32`` over bf16 weights: the head is fp32 and its logits are fp32 arithmetic inside
    the run's bf16 autocast (a bf16 matmul would be about 1e-2 off), which the rollout and the training forward both
    use (tarpo/engine/backbone.py); a model whose head is tied to its embedding is refused before it loads."""
    from transformers import AutoModelForCausalLM
    from tarpo.engine.precision import mixed_precision
    from tarpo.models.backends import make_backbone
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    args = config(tmp_path, cast_lm_head_to_fp32=True, bf16=True, use_cpu=True, max_steps=1)
    trainer = TarpoTrainer(model, codes, args=args, train_dataset=standard())
    backbone = make_backbone(trainer.model)
    assert backbone.lm_head.weight.dtype == torch.float32 and backbone.embed_weight.dtype == torch.bfloat16
    hidden = torch.randn(5, backbone.config.hidden_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    with mixed_precision(backbone):
        logits = backbone.logits(hidden)
    exact = hidden.double() @ backbone.lm_head.weight.double().T
    assert logits.dtype == torch.float32 and (logits.double() - exact).abs().max() < 1e-5
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert log["logp_drift_max"] < 0.1  # rollout and training forward agree (both fp32 logits over bf16 bodies)
    tied = tmp_path / "tied"
    tok = char_tokenizer()
    tiny_causal_lm(tok, "qwen2", seed=0, tie_word_embeddings=True).save_pretrained(tied)
    tok.save_pretrained(tied)
    refused = r"^TarpoConfig\.cast_lm_head_to_fp32=True: the model ties its head"
    with pytest.raises(ValueError, match=refused):
        TarpoTrainer(str(tied), codes, args=config(tmp_path / "t", cast_lm_head_to_fp32=True),
                     train_dataset=standard())


def test_what_a_reward_function_logs_through_trl_reaches_the_log(model_dir, tmp_path):
    """TRL's ``log_metric`` and ``log_extra`` (kwargs of every reward function): the metric is logged at its step,
    the column joins the completion table, and nothing stays pending (before: lost, the lists growing all run)."""
    def logging_reward(prompts, completions, log_metric=None, log_extra=None, **kwargs):
        rewards = codes(prompts, completions)
        log_metric("my/mean", sum(rewards) / len(rewards))
        log_extra("my_column", [f"r={r:.2f}" for r in rewards])
        return rewards
    args = config(tmp_path, log_completions=True)
    trainer = TarpoTrainer(model_dir, logging_reward, args=args, train_dataset=standard())
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(0 <= h["my/mean"] <= 1 for h in logs)
    assert len(trainer._logs["extra"]["my_column"]) == args.generation_batch_size  # the last generation batch's
    assert not trainer._pending_metrics and not trainer._pending_extra_logs


def test_full_fine_tuning_decays_and_keeps_state_as_transformers_does(model_dir, tmp_path):
    """``use_peft=False``: weight decay on the weights transformers decays (``get_decay_parameter_names``), none on
    norm weights and biases (before: 0.1 on every parameter); under 8-bit AdamW the embedding's optimizer state is
    32-bit, as transformers gives it (before: quantised)."""
    args = config(tmp_path, use_peft=False, weight_decay=0.1, optim="adamw_bnb_8bit")
    trainer = TarpoTrainer(model_dir, codes, args=args, train_dataset=standard())
    optimizer = trainer.create_optimizer()
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    trained = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    expected = set(trainer.get_decay_parameter_names(trainer.model)) & set(trained)
    assert {n for n, p in trained.items() if id(p) in decayed} == expected
    assert any("norm" in n for n in set(trained) - expected)  # left undecayed
    embedding = trainer.model.get_input_embeddings().weight
    assert optimizer.mng.pid2config[id(embedding)] == {"optim_bits": 32}


def test_sync_ref_model_moves_the_routers_reference_too(model_dir, tmp_path):
    """TRL's ``sync_ref_model`` under TARPO's learned routing, full fine-tuning: the token reference and the router's
    reference both move to alpha * policy + (1 - alpha) * reference at each sync (before: TRL's callback, pairing
    parameters one by one, failed on the router, and the router's reference never moved). The learning rate is
    1e-2, not TRL's 1e-6: one Adam step then moves a trained weight by about 1e-2, so a reference left where it was
    differs from the synced one by far more than assert_close's tolerance (at 1e-6 the difference, 5e-7, was under
    it, and a callback that did not sync the token reference passed)."""
    args = TarpoConfig(output_dir=str(tmp_path / "run"), routing="learned", **{
        **trl_defaults(), **SIZES, "use_peft": False, "beta": 0.04, "sync_ref_model": True, "ref_model_sync_steps": 1,
        "ref_model_mixup_alpha": 0.5, "max_steps": 1, "learning_rate": 1e-2})
    trainer = TarpoTrainer(model_dir, codes, args=args, train_dataset=standard())
    ref_router = {n: p.detach().clone() for n, p in trainer.ref_router.named_parameters()}
    ref_embed = trainer.ref_model.get_input_embeddings().weight.detach().clone()
    trainer.train()
    # exact: any change at all counts as trained
    assert any(not torch.equal(p, ref_router[n]) for n, p in trainer.router.named_parameters())
    for n, p in trainer.router.named_parameters():  # (ref + router) / 2
        torch.testing.assert_close(dict(trainer.ref_router.named_parameters())[n], (ref_router[n] + p) / 2)
    embed = trainer.model.get_input_embeddings().weight
    assert (embed - ref_embed).abs().max() > 1e-3  # trained far beyond the tolerance below
    torch.testing.assert_close(trainer.ref_model.get_input_embeddings().weight, (ref_embed + embed) / 2)


def test_no_train_dataset_is_refused_in_trls_words(model_dir, tmp_path):
    """TRL 1.15 refuses ``train_dataset=None`` too ("`train_dataset` is required unless an `environment_factory` is
    provided."): the same words, and why the exception does not apply."""
    with pytest.raises(ValueError, match=r"^`train_dataset` is required \(TarpoTrainer serves no `environment_"):
        TarpoTrainer(model_dir, codes, args=config(tmp_path), train_dataset=None)


def test_a_streaming_data_set_trains_for_max_steps(model_dir, tmp_path):
    """A datasets.IterableDataset with max_steps, as TRL takes it (before: len() of the training set, TypeError)."""
    stream = datasets.IterableDataset.from_generator(lambda: ({"prompt": f"question {i} is"} for i in range(64)))
    trainer = TarpoTrainer(model_dir, codes, args=config(tmp_path), train_dataset=stream)
    assert len(trains_every_parameter(trainer)) == 2


def test_the_constructor_takes_grpo_trainers_parameters_in_its_order(model_dir, tmp_path):
    """GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, ...): positional
    arguments land where TRL's do, args and processing_class are optional (before: both required, and the 5th
    positional parameter was processing_class). What the trainer cannot serve is refused with its reason."""
    from trl import GRPOTrainer

    data, args = standard(), None
    trainer = TarpoTrainer(model_dir, codes, config(tmp_path), data, data)  # eval_dataset 5th, as TRL's
    assert trainer.eval_dataset is data and trainer.processing_class is not None  # the folder's tokenizer
    # args None: TRL's default configuration, <model name>-GRPO, as TarpoConfig's <model name>-TARPO; on a CPU
    # TRL's default asks for bf16 and both refuse alike
    with pytest.raises(ValueError) as trl_error:
        GRPOTrainer(model_dir, codes, args, data)
    with pytest.raises(ValueError) as ours:
        TarpoTrainer(model_dir, codes, args, data)
    assert str(ours.value) == str(trl_error.value) and "bf16" in str(ours.value)
    with pytest.raises(ValueError, match=r"TarpoTrainer\(tools=\.\.\.\): not served: tool calls"):
        TarpoTrainer(model_dir, codes, config(tmp_path), data, tools=[len])


def test_a_routing_without_a_router_has_none(model_dir, tmp_path):
    """GRPO (routing hard) attaches no router to the user's model and saves none (before: a frozen tarpo_router)."""
    import os
    trainer = TarpoTrainer(model_dir, codes, args=config(tmp_path), train_dataset=standard())
    assert trainer.router is None and not any("tarpo_router" in n for n, _ in trainer.model.named_parameters())
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    assert "router.safetensors" not in os.listdir(tmp_path / "adapter")


def test_evaluation_before_during_and_after_training_uses_trls_scaling(model_dir, tmp_path):
    """evaluate() before train() (before: AttributeError, current_gradient_accumulation_steps), eval_on_start, and
    an evaluation loss that does not depend on the gradient accumulation (before: divided by it)."""
    data = standard()
    losses = {}
    for steps in (1, 4):
        args = config(tmp_path / str(steps), gradient_accumulation_steps=steps, per_device_eval_batch_size=4,
                      seed=3)
        trainer = TarpoTrainer(model_dir, codes, args=args, train_dataset=data, eval_dataset=data)
        losses[steps] = trainer.evaluate()["eval_loss"]
    assert math.isfinite(losses[1]) and losses[1] == pytest.approx(losses[4], rel=1e-5, abs=1e-7)
    args = config(tmp_path / "start", eval_on_start=True, eval_strategy="steps", eval_steps=1,
                  per_device_eval_batch_size=4)
    trainer = TarpoTrainer(model_dir, codes, args=args, train_dataset=data, eval_dataset=data)
    trainer.train()
    assert sum("eval_loss" in h for h in trainer.state.log_history) == 3  # on start, after steps 1 and 2


def test_chat_template_kwargs_reach_the_chat_template():
    """TRL's chat_template_kwargs are the template's arguments, in training's prompts as in TRL's."""
    from tarpo.tasks.prompts import encode_prompts

    tok = char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if shout %}!{% endif %}"
    prompt = [[{"role": "user", "content": "hi"}]]
    plain, loud = (encode_prompts(tok, prompt, 50, template_kwargs=kw)[0] for kw in (None, {"shout": True}))
    assert tok.decode(plain[0]) == "hi" and tok.decode(loud[0]) == "hi!"


def test_a_grpo_config_and_fp16_are_refused_saying_what_to_do(model_dir, tmp_path):
    """A GRPOConfig as args: one line naming the swap (the docs say a script runs with both classes swapped);
    fp16: refused with why (the scaler's overflow steps would be counted as non-finite steps; before: accepted)."""
    with pytest.raises(TypeError, match=r"^args must be a TarpoConfig .* not GRPOConfig: swap GRPOConfig for Tarpo"):
        TarpoTrainer(model_dir, codes, train_dataset=standard(),
                     args=GRPOConfig(output_dir=str(tmp_path / "g"), report_to="none", use_cpu=True, bf16=False))
    with pytest.raises(ValueError, match=r"^TarpoConfig.fp16=True: not served: the loss scaler's own overflow"):
        TarpoConfig(output_dir=str(tmp_path / "f"), fp16=True)


def test_trls_own_generation_helper_runs_as_trls_tests_call_it(model_dir, tmp_path):
    """GRPOTrainer._generate, inherited (TRL's tests call it directly): it reads eos_token_ids, which the trainer
    sets (before: AttributeError). It samples with transformers' generate, hard tokens only; TARPO's rollouts are
    _generate_and_score_completions'. A rollout_func, which it would call, is refused at construction."""
    trainer = TarpoTrainer(model_dir, codes, args=config(tmp_path), train_dataset=standard())
    out = trainer._generate(["question 0 is", "question 1 is"])
    prompt_ids, completion_ids = out[0], out[1]
    assert len(prompt_ids) == len(completion_ids) == 2 and all(len(c) >= 1 for c in completion_ids)
    with pytest.raises(ValueError, match=r"^TarpoTrainer\(rollout_func=\.\.\.\): not served"):
        TarpoTrainer(model_dir, codes, args=config(tmp_path), train_dataset=standard(), rollout_func=lambda *a: {})
