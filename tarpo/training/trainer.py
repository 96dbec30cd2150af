"""``TarpoTrainer``: TRL's ``GRPOTrainer`` with TARPO's generation, scoring and loss.

What is TRL's and kept: the repeat sampler (G consecutive copies of each prompt), the reward plumbing
(``reward_funcs(prompts=, completions=, completion_ids=, **columns)``), buffering of a generation batch over
gradient-accumulation steps, logging, PEFT set-up, checkpointing and resuming. What is overridden, and why:

- ``_generate_and_score_completions``: decodes with :func:`tarpo.engine.rollout.hybrid_generate` (per-step hard/soft
  inputs) and returns the whole rollout record, which survives TRL's shuffle/split of the generation batch because
  every field is batch-first; advantages are computed here, over whole groups, by :func:`reward_advantages`.
- ``_compute_loss``: rebuilds the inputs, scores policy and reference (:func:`tarpo.training.scoring.score_rollout`)
  and applies :func:`tarpo.training.objective.tarpo_loss`; ``_get_grad_norm`` skips a non-finite step
  (:mod:`tarpo.training.nonfinite`); what a rollout and a step log is :class:`TrainerLogs`'s
  (:mod:`tarpo.training.trainer_logs`).
- ``create_optimizer``: parameter groups for LoRA (``learning_rate``), the router (``router_lr``) and the soft
  input's own (HRPO's gate: ``hrpo_lr``, ``hrpo_lambda_lr``); under an 8-bit optimizer the router and the soft
  input keep fp32 state (:mod:`tarpo.training.optimizer`).
- ``_save_checkpoint`` / ``save_model`` / ``_load_from_checkpoint`` and the resume: the heads saved beside the adapter,
  each checkpoint written whole, a resume from the newest complete one (:class:`TrainerCheckpoints`, its own module
  :mod:`tarpo.training.trainer_checkpoints`); ``save_on_signals`` stop a run with a checkpoint
  (:mod:`tarpo.training.preemption`).
- ``use_adaptive_entropy``: TRL's controller of ``entropy_coef``, on TRL's attributes (:class:`TrainerEntropy`).

The router (and a soft input with parameters, HRPO's gate) are submodules of the PEFT model's base model, so the
Trainer zeroes, clips and (under DDP) synchronises their gradients with the LoRA ones; the router trains only under
a routing that uses it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import fields, replace

import torch
from peft import LoraConfig
from accelerate.utils import is_peft_model
from trl.trainer.callbacks import SyncRefModelCallback

from ..config import TarpoConfig
from ..engine.backbone import Backbone, unwrap
from ..engine.decode_weights import weights_held
from ..engine.engine_choice import EngineChooser, decoder_layers
from ..engine.soft_input import soft_input_class
from ..engine.precision import mixed_precision
from ..engine.records import ROLLOUT_FIELDS, padded
from ..engine.rollout import Policy, Rollout, RolloutSpec, hybrid_generate
from ..engine.router import Router
from ..engine.tagging import token_text_fn
from ..atomic_files import write_json_atomic
from ..models.backends import make_backbone
from ..models.loading import lora_config, new_router, stop_token_ids
from ..patches.trl_guard import check_overrides, pristine_grpo_trainer
from ..tasks.prompts import encode_prompts
from . import metrics, sharding, trl_contract
from .callbacks import StepResources, SyncReferences
from .decode_level import RunDecodeLevel
from .trainer_checkpoints import TrainerCheckpoints
from .trainer_entropy import TrainerEntropy
from .trainer_logs import TrainerLogs
from .grad_checkpointing import checkpointing_paused
from .distributed import all_values, forward_through, rollout_seed, same_on_every_rank
from .nonfinite import NonFiniteGuard, skip_or_take
from .advantages import reward_advantages
from .loss_inputs import loss_mask, rollout_loss
from .objective import LossSettings
from .preemption import SaveOnSignal
from .optimizer import embedding_weights, keep_fp32_state, parameter_groups
from .scoring import StepScores, ScoreSettings, score_rollout

logger = logging.getLogger(__name__)
GRPOTrainer = pristine_grpo_trainer()  # TRL's own class, never Unsloth's rewrite of it (tarpo.patches.trl_guard)

class TarpoTrainer(TrainerCheckpoints, TrainerLogs, TrainerEntropy, GRPOTrainer):
    def __init__(self, model, reward_funcs=None, args: TarpoConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_processing_classes=None, callbacks=None,
                 optimizers=(None, None), quantization_config=None, peft_config: LoraConfig | None = None,
                 tools=None, rollout_func=None, environment_factory=None, router: Router | None = None):
        """GRPOTrainer's parameters in its order and with its defaults (tarpo.training.trl_contract), and
        ``router``: the router to train (a new one, :func:`tarpo.models.loading.new_router`, by default)."""
        args = trl_contract.default_args(model) if args is None else args
        if not isinstance(args, TarpoConfig):  # TARPO's own fields (routing, router, ...) have no place in another
            raise TypeError(f"args must be a TarpoConfig (TRL's GRPOConfig with TARPO's fields), not "
                            f"{type(args).__name__}: swap GRPOConfig for TarpoConfig as GRPOTrainer for TarpoTrainer")
        trl_contract.refuse_unserved(tools=tools, rollout_func=rollout_func, environment_factory=environment_factory)
        trl_contract.check_dataset(train_dataset)
        trl_contract.refuse_quantized(model, quantization_config, args)
        trl_contract.refuse_tied_fp32_head(model, args)
        if peft_config is None and args.use_peft and (isinstance(model, str) or not is_peft_model(model)):
            peft_config = lora_config(args)  # the paper's LoRA (TarpoConfig.lora_*); use_peft=False: full fine-tuning
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class,
                         reward_processing_classes=reward_processing_classes, callbacks=callbacks,
                         optimizers=optimizers, quantization_config=quantization_config, peft_config=peft_config)
        trl_contract.warn_too_long(self.processing_class, train_dataset, args)
        peft_model = self.accelerator.unwrap_model(self.model)
        self.eos_token_ids = stop_token_ids(peft_model, self.processing_class)  # as eval stops (models/loading.py)
        self.engine = EngineChooser(self.args.rollout_engine, decoder_layers(peft_model))  # ENGINE=auto by cost
        self.decode_level = RunDecodeLevel(self.args.output_dir, self.accelerator.is_main_process)  # one a run
        if "ref" in getattr(peft_model, "peft_config", {}):
            # TRL copies a passed-in adapter as "ref"; docs/algorithm.md §2's reference is the adapter disabled.
            peft_model.delete_adapter("ref")
        base = unwrap(peft_model)
        self.ref_router = None
        if args.rule.router:  # only a routing that routes with it has a router (GRPO and the other baselines none)
            router = router if router is not None else new_router(base, args)
            # TRL seeds each rank differently (set_seed(..., device_specific=True)), so each rank drew its own
            # router; DDP will train rank 0's on every rank, and the frozen reference must be that one too
            base.tarpo_router = same_on_every_rank(router.to(self.accelerator.device))
            self.ref_router = router.frozen_copy()
        self.token_text = token_text_fn(self.processing_class)
        self.loss_settings = LossSettings.of(args)  # built once: what tarpo_loss is computed with besides the batch
        self.score_settings = ScoreSettings.of(args)  # ... and how the batch is scored
        self.soft_input = soft_input_class(args.rule.soft_input).for_run(args, base)  # what a soft step feeds
        if args.rule.soft.trained:  # a submodule of the policy, so that DDP / FSDP2 see its parameters
            base.tarpo_soft_input = self.soft_input.to(self.accelerator.device)
        self._seed_step, self._seed_index = None, 0
        self._loss_figures = metrics.LossFigures(self.accelerator.gather)
        self._report_settings = metrics.ReportSettings(self.accelerator.gather, self.num_generations,
                                                       tuple(self.reward_funcs), tuple(self.reward_func_names),
                                                       args.rule.router, self.accelerator.device)
        self._resources = StepResources(self._metrics["train"], lambda: self.model)  # timing/, memory/, hooks/
        self.add_callback(self._resources)
        self.nonfinite = NonFiniteGuard(args.max_nonfinite_steps)  # a non-finite step is skipped, counted
        self.stop_signal = SaveOnSignal(args.save_on_signals) if args.save_on_signals else None
        if args.sync_ref_model:  # TRL's callback pairs parameters one by one, which the router's presence breaks
            self.pop_callback(SyncRefModelCallback)
            self.add_callback(SyncReferences(lambda: unwrap(self.accelerator.unwrap_model(self.model)),
                                             lambda: (self.ref_model, self.router, self.ref_router)))
        if self.stop_signal is not None:  # a preemption: the step in flight finished, a checkpoint, then stop
            self.add_callback(self.stop_signal)
        if sharding.check_sharding(self.accelerator):  # FSDP2: accelerate shards the model when training starts
            sharding.prepare(self.accelerator, [p for p in peft_model.parameters() if p.requires_grad])
        check_overrides(self, TarpoTrainer)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        check_overrides(self, TarpoTrainer)  # again: something may have patched the instance since __init__
        resume_from_checkpoint = self._resume_point(resume_from_checkpoint)
        if resume_from_checkpoint is not None and self._at_the_end(resume_from_checkpoint):
            return self._end_at(resume_from_checkpoint)
        self.nonfinite.reset()  # each call counts afresh (a retry in one process); a resume reads its log
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:  # on every way out, an exception included (the Trainer calls on_train_end only at the end)
            if self.stop_signal is not None:
                self.stop_signal.restore()

    def evaluate(self, *args, **kwargs):
        """TRL's evaluation, the compiled engine's decode weights built once for it (the adapter does not change);
        each rollout builds its own under FSDP2, whose gathered tensors are freed after it."""
        self._loss_figures.discard("eval")  # what a predict() left: only this evaluation's figures are logged
        with contextlib.nullcontext() if sharding.units(self.model) else weights_held():
            return super().evaluate(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's contract, stated here so that no rewrite of the base class can bypass ``_compute_loss``."""
        if return_outputs:
            raise ValueError("TarpoTrainer does not return outputs from compute_loss")
        return self._compute_loss(model, inputs)

    @property
    def router(self) -> Router | None:
        """The trained router; None under a routing that has none (GRPO and the other baselines)."""
        return getattr(unwrap(self.accelerator.unwrap_model(self.model)), "tarpo_router", None)

    def backbone(self) -> Backbone:
        return make_backbone(self.accelerator.unwrap_model(self.model))

    def create_optimizer(self, model=None):
        if self.optimizer is not None:
            return self.optimizer
        opt_model = self.model if model is None else model
        args = self.args
        cls, kwargs = self.get_optimizer_cls_and_kwargs(args, opt_model)
        groups, heads = parameter_groups(opt_model, self.router, self.soft_input, args,
                                         set(self.get_decay_parameter_names(opt_model)))
        self.optimizer = cls(groups, **kwargs)
        keep_fp32_state(self.optimizer, heads + embedding_weights(opt_model))
        return self.optimizer

    # ------------------------------------------------------------------ generation
    def _engine_decided(self, seconds: float, decode_steps: int) -> None:
        """ENGINE=auto on the CPU, after the first (eager, timed) rollout: pick the engine of the others,
        say which and why, and keep it in ``<output_dir>/rollout_engine.json`` (tarpo/engine/engine_choice.py)."""
        args, steps_left = self.args, max(0, self.state.max_steps - self.state.global_step - 1)
        per_rollout = max(1, args.generation_batch_size // self.accelerator.num_processes)  # completions a rollout
        rollouts_a_step = max(1, args.per_device_train_batch_size * args.gradient_accumulation_steps // per_rollout)
        decision = self.engine.observed(seconds, decode_steps, steps_left * rollouts_a_step * decode_steps)
        if decision is not None and self.accelerator.is_main_process:
            logger.warning("rollout engine: %s (ENGINE=auto; %s)", decision["engine"], decision["why"])
            os.makedirs(self.args.output_dir, exist_ok=True)
            write_json_atomic(os.path.join(self.args.output_dir, "rollout_engine.json"), decision)

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        device = self.accelerator.device
        prompts = [x["prompt"] for x in inputs]
        prompt_ids, prompt_mask, n_trunc = encode_prompts(self.processing_class, prompts, self.args.max_prompt_length,
                                                          device, self.args.chat_template_kwargs)
        # the run's one rollout shape (compiled engine: one graph per run): this process's share of a generation batch
        spec = RolloutSpec.from_config(self.args, router_greedy=False,
                                       batch_size=self.args.generation_batch_size // self.accelerator.num_processes)
        model = self.accelerator.unwrap_model(self.model)
        # Keyed noise: global row ids (this rank's share of the batch) and a seed every rank shares, so
        # a row draws the same on any number of processes, with either engine, after a resume.
        rows = torch.arange(len(prompts)) + self.accelerator.process_index * len(prompts)
        started = time.perf_counter()
        self._resources.rollout_started()  # memory/rollout_peak_gib: the rollout's own
        spec = replace(spec, engine=self.engine.next(device.type == "cuda"),
                       decode_merge=self.decode_level.requested(spec.decode_merge))
        # sharded (FSDP2): the whole model gathered for the rollout, each rank decoding alone (tarpo.training.sharding)
        with sharding.gathered(model), checkpointing_paused(model):
            backbone = make_backbone(model)
            with mixed_precision(backbone):
                policy = Policy(backbone, self.token_text, self.eos_token_ids, self.processing_class.pad_token_id,
                                self.router, self.soft_input)
                rollout = hybrid_generate(policy, prompt_ids, prompt_mask, spec, noise_seed=self._next_rollout_seed(),
                                          row_ids=rows)
        self._metrics[mode]["timing/rollout_s"].append(seconds := time.perf_counter() - started)
        self._resources.rollout_ended(self._metrics[mode])  # memory/rollout_peak_gib
        self._engine_decided(seconds, rollout.token_ids.shape[1])
        self.decode_level.record(model, spec.engine)

        completion_ids = [ids[m].tolist() for ids, m in zip(rollout.token_ids, rollout.completion_mask)]
        texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if isinstance(prompts[0], list) else texts
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids)  # all processes
        rewards, advantages = reward_advantages(rewards_per_func, self.reward_weights.to(device), self.num_generations,
                                                self.args.advantage_eps, self.args.scale_rewards,
                                                self.args.multi_objective_aggregation)
        local = slice(self.accelerator.process_index * len(prompts),
                      (self.accelerator.process_index + 1) * len(prompts))

        self._report(mode, rollout, rewards, rewards_per_func, n_trunc, (prompts, completions, advantages))
        training = padded(rollout, self.args.pad_to_multiple_of, self.processing_class.pad_token_id)  # TRL's lengths
        out = {key: getattr(training, key) for key in ROLLOUT_FIELDS}
        out["advantages"] = advantages[local]
        # loss_type="dapo": the units of the whole generation batch (every process), per process and optimizer step;
        # an evaluation batch is neither split across steps nor accumulated (TRL's normalizer)
        units = self.accelerator.gather(loss_mask(self.loss_settings, rollout).sum()[None]).sum().float()
        steps = self.args.steps_per_generation if mode == "train" else 1
        out["num_units"] = (units / (self.accelerator.num_processes * steps)).expand(len(prompts))
        return out

    def _next_rollout_seed(self) -> int:
        step = self.state.global_step
        if step != self._seed_step:
            self._seed_step, self._seed_index = step, 0
        self._seed_index += 1
        return rollout_seed(self.args.seed, step, self._seed_index - 1)

    # ------------------------------------------------------------------ loss
    def _compute_loss(self, model, inputs):
        rollout = Rollout(**{key: inputs[key] for key in ROLLOUT_FIELDS})
        # through the module accelerate wrapped, so that DDP all-reduces the gradients (tarpo.training.distributed)
        scores = StepScores(**forward_through(model, self.accelerator.unwrap_model(model),
                                              lambda: self._scores(model, rollout)))
        settings = self._loss_settings_now()  # the adaptive entropy coefficient of this micro-batch (TrainerEntropy)
        loss, terms = rollout_loss(settings, scores, rollout, inputs["advantages"], inputs["num_units"][0],
                                   gather=lambda values: all_values(self.accelerator, values))
        terms.update(metrics.loss_type_metrics(settings, scores.logp_tok, rollout, inputs["advantages"]))
        mode = "train" if self.model.training else "eval"
        self._observe_entropy(terms, mode)
        # the accumulation steps a training step sums (TRL's scaling; an evaluation accumulates nothing)
        accumulated = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if mode == "train":  # an evaluation's loss never decides a training step
            self.nonfinite.observe_loss(loss)
        terms.pop("logp_drift_p99")  # one a step, over all its micro-batches (LossFigures)
        drift = metrics.drift_steps(scores.logp_tok.detach(), rollout.logp, rollout.completion_mask)
        self._loss_figures.add(mode, terms, drift)  # read once a step (flushed at the optimizer step, the log)
        return loss / accumulated

    def _scores(self, model, rollout: Rollout) -> dict:
        """The current policy's scores of ``rollout`` (:func:`tarpo.training.scoring.score_rollout`) as a dict of
        tensors (what DDP's forward returns). It replaces accelerate's autocast wrapper of model.forward: the
        precision is entered here."""
        sharding.gather_direct_reads(self.accelerator.unwrap_model(model))  # FSDP2: embedding and head whole
        backbone = self.backbone()
        mode = "train" if self.model.training else "eval"
        with mixed_precision(backbone), self._resources.timed(self._metrics[mode], "timing/scoring_s",
                                                              self.args.time_scoring):
            ref_router = self.ref_router.to(self.accelerator.device) if self.ref_router is not None else None
            reference = make_backbone(self.ref_model) if self.ref_model is not None else None  # full fine-tuning
            scores = score_rollout(backbone, self.router, ref_router, rollout, self.score_settings, self.soft_input,
                                   reference)
        return {f.name: getattr(scores, f.name) for f in fields(scores) if getattr(scores, f.name) is not None}

    def _get_grad_norm(self, model, grad_norm=None):
        """The Trainer's, then the non-finite check of the step (tarpo.training.nonfinite): a step whose loss or
        gradient norm is not finite changes no parameter, optimizer state or learning rate."""
        grad_norm = super()._get_grad_norm(model, grad_norm)
        full = getattr(grad_norm, "full_tensor", None)  # FSDP2: the norm as a DTensor
        finite = self.nonfinite.decide(full() if full is not None else grad_norm, self.state.log_history)
        skip_or_take(self, finite)
        self._metrics["train"]["nonfinite_steps"].append(float(self.nonfinite.count))  # the run's count, logged
        if (stop := self.nonfinite.stop(self.state.global_step + 1, self.args.output_dir)) is not None:
            raise stop
        self._loss_figures.flush("train", self._metrics["train"])  # the step's figures: one host read
        return grad_norm
