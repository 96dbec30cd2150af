"""TARPO's configuration: TRL's ``GRPOConfig`` plus every knob of the method.

Each field cites where its default comes from: "docs/algorithm.md §n" is this project's account of the method,
"Table 6" / "Table 7" the paper's hyper-parameter and length tables (Appendix A). Defaults are the paper's values
for Qwen2.5-1.5B/7B on MATH; the launchers override them per model and data set.
"""

from __future__ import annotations

import signal
from dataclasses import MISSING, dataclass, field

import torch
from trl import GRPOConfig

from .losses import LOSS_TYPES, LOSSES  # the loss variants' table owns their names
from .algorithms import HRPO_MIXTURES, ROUTINGS, Routing
from .trl_fields import PINNED  # the inherited fields pinned to what runs (with the honoured and the inert)

TOKEN_KL_MODES = ("k3", "full")
SCALE_REWARDS = ("group", "batch", "none")       # tarpo.training.advantages.group_advantages
IS_LEVELS = ("token", "sequence")                # tarpo.losses.importance_ratio
IS_CORRECTIONS = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
ENTROPY_SIDES = ("high", "low")                  # 'entropy' routing: soft where the entropy is above / below
ENGINES = ("auto", "eager", "compiled")  # rollout engines (tarpo.engine.rollout, tarpo.engine.static_decode)
# what the compiled engine decodes with (tarpo.engine.decode_weights): the LoRA merged into copies of the projections
# that carry it (q|k|v and o; "all": gate|up and down too) or applied as an adapter; "auto": the memory plan's, or
# without a plan the free memory's; the levels after "auto" from the most copies to none
DECODE_MERGES = ("auto", "all", "attention", "none")


def sampling_problem(settings) -> tuple[str, str] | None:
    """``(field, why)`` of the first invalid sampling setting that ``settings`` has (a TarpoConfig, a RolloutSpec,
    ``tarpo eval``'s flags), else None: the one rule of the three, each refusing it under its own name."""
    rules = {"temperature": (lambda v: v > 0, "must be > 0 (the log-probs are scored at this temperature)"),
             "top_k": (lambda v: v is not None and v >= 0, "must be >= 0 (0 disables top-k filtering)"),
             "top_p": (lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"),
             "min_p": (lambda v: v is None or 0.0 <= v <= 1.0, "must be in [0, 1] (or None: off)"),
             "soft_top_k": (lambda v: isinstance(v, int) and v >= 1, "must be an integer >= 1"),
             "entropy_threshold": (lambda v: v >= 0, "must be >= 0"),
             "entropy_soft_when": (lambda v: v in ENTROPY_SIDES, f"must be one of {', '.join(ENTROPY_SIDES)}"),
             **{name: (lambda v: v > 0, "must be > 0") for name in ("action_temperature", "entropy_temperature")}}
    return next(((name, why) for name, (valid, why) in rules.items()
                 if hasattr(settings, name) and not valid(getattr(settings, name))), None)


def signal_numbers(names) -> list[int]:
    """Signals by name (``SIGTERM`` or ``TERM``, any case) as numbers; an unknown name raises ``ValueError``.

    >>> [int(s) for s in signal_numbers(["TERM", "sigusr1"])] == [signal.SIGTERM, signal.SIGUSR1]
    True
    """
    out = []
    for name in names:
        full = name.strip().upper()
        full = full if full.startswith("SIG") else "SIG" + full
        if full in ("SIGKILL", "SIGSTOP") or not isinstance(getattr(signal, full, None), signal.Signals):
            raise ValueError(f"{name!r} is not a signal a process can catch (e.g. SIGTERM, SIGUSR1)")
        out.append(getattr(signal, full))
    return out


def resolve_optimizer(name: str) -> str:
    """The 8-bit optimizers need bitsandbytes; paging needs CUDA. Fall back explicitly."""
    if "8bit" in name or "bnb" in name or name.startswith("paged"):
        try:
            import bitsandbytes  # noqa: F401
        except Exception:
            return "adamw_torch"
        if name.startswith("paged") and not torch.cuda.is_available():
            name = {"paged_adamw_8bit": "adamw_bnb_8bit", "paged_adamw_32bit": "adamw_torch"}.get(name, name)
    return name


@dataclass
class TarpoConfig(GRPOConfig):
    # ---- TRL/Trainer fields whose defaults are the paper's (Table 6) ----
    learning_rate: float = field(default=5e-6, metadata={"help": "Backbone (LoRA) LR. Paper: 5e-6 Qwen, 2e-6 Llama "
                                                                 "(Table 6)."})
    temperature: float = field(default=0.5, metadata={"help": "Sampling temperature T_s; log-probs are scored at it. "
                                                              "Paper: 0.5 (Table 6)."})
    top_k: int = field(default=0, metadata={"help": "Top-k filter of the token policy; 0 = off, stated explicitly "
                                                    "(docs/algorithm.md §1)."})
    top_p: float = field(default=1.0, metadata={"help": "Top-p filter of the token policy; 1.0 = off, stated "
                                                        "explicitly (docs/algorithm.md §1)."})
    beta: float = field(default=0.005, metadata={"help": "beta, weight of the KL term L_KL (docs/algorithm.md §2, "
                                                         "Table 6)."})
    num_generations: int | None = field(default=8, metadata={"help": "Group size G. Paper: 4 GSM8K, 8 MATH/DAPO "
                                                                     "(Table 6)."})
    max_completion_length: int | None = field(default=1024, metadata={
        "help": "Max generated units (hard + soft). Paper: 1024 GSM8K/MATH, 2048 DAPO (Table 7)."})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay. Paper: 0.1 (Table 6)."})
    adam_beta2: float = field(default=0.99, metadata={"help": "AdamW beta2. Paper: 0.99 (Table 6)."})
    max_grad_norm: float = field(default=0.1, metadata={"help": "Gradient clipping norm. Paper: 0.1 (Table 6)."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "LR schedule. Paper: cosine (Table 6)."})
    warmup_steps: float = field(default=0.1, metadata={"help": "Linear warm-up: a fraction of the steps if < 1, else "
                                                        "a step count (transformers 5 has no warmup_ratio). Paper: "
                                                        "ratio 0.1 (Table 6)."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Epochs. Paper: 1 (Table 6)."})
    optim: str = field(default="paged_adamw_8bit", metadata={
        "help": "Optimizer. Paper: 8-bit AdamW, paged_adamw_8bit (docs/algorithm.md §4). Resolved at construction: "
                "without CUDA the non-paged adamw_bnb_8bit (bitsandbytes steps CPU tensors); without a working "
                "bitsandbytes plain adamw_torch with the same hyper-parameters."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N optimizer steps (every step by default)."})
    logging_nan_inf_filter: bool = field(default=False, metadata={
        "help": "transformers' filter that logs a NaN or inf loss as the average of the others; off, so that the loss "
                "of a step skipped for a non-finite value is logged as it was (max_nonfinite_steps)."})
    max_nonfinite_steps: int = field(default=3, metadata={
        "help": "A step whose loss or gradient norm is not finite is skipped (no parameter, optimizer state or LR "
                "schedule changes; counted as nonfinite_steps); this many in a row stop the run, naming the last "
                "complete checkpoint (tarpo.training.nonfinite)."})
    save_on_signals: list[str] = field(default_factory=list, metadata={
        "help": "Signals (e.g. SIGTERM, SIGUSR1) that stop training after the step in flight with a complete "
                "checkpoint, as a scheduler's preemption asks (tarpo.training.preemption). Empty (TRL's behaviour): "
                "none; the launchers set SIGTERM and SIGUSR1."})
    time_scoring: bool = field(default=False, metadata={
        "help": "Log timing/scoring_s: the seconds of a micro-batch's training forward (policy and reference scored, "
                "before the backward), averaged over the step's micro-batches, the device synchronised around it. Off "
                "by default: each synchronisation stalls the host's queue of kernels (tarpo.training.callbacks)."})
    disable_dropout: bool = field(default=True, metadata={"help": "Dropout off so policy and reference score the same "
                                                                  "inputs identically."})
    # ---- inherited fields of the loss (docs/algorithm.md §8): the paper's values by default ----
    loss_type: str = field(
        default="grpo", metadata={"help": "The loss variant (tarpo.losses.LOSSES, docs/algorithm.md §8): the "
                                          "surrogate of the token and router terms, and how they and the KL terms "
                                          "are aggregated, all the same way. "
                                          + "; ".join(f"'{t.name}': {t.help}" for t in LOSSES.values()) + "."})
    scale_rewards: str = field(
        default="group", metadata={"help": "Advantage scaling: 'group' (the paper) (r - group mean) / (group std + "
                                           "advantage_eps); 'batch' divides by the batch's std; 'none' by nothing."})
    importance_sampling_level: str = field(
        default="token", metadata={"help": "Level of the clipped ratio of the token and router terms: 'token' (the "
                                           "paper) per step; 'sequence' (GSPO) one ratio per trajectory from the mean "
                                           "of its log-ratios."})
    top_entropy_quantile: float = field(
        default=1.0, metadata={"help": "rho of Beyond the 80/20 Rule (TRL's): the token term only at the top rho "
                                       "of the batch's steps by the entropy of the token distribution (every "
                                       "process's steps together); the router and KL terms keep every step. "
                                       "1.0 (the paper): off; the 80/20 paper uses 0.2 (docs/algorithm.md §8)."})
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "Leave completions that hit max_completion_length without an end token out "
                                         "of the loss (DAPO). The paper keeps them (False)."})
    # ---- the rollout/training mismatch (docs/algorithm.md §8) ----
    is_correction: str = field(
        default="none", metadata={"help": "Importance-sampling correction of the mismatch between the rollout's "
                                          "log-probs and the training forward's, over the tokens and the routing "
                                          "actions: 'none' (the paper); 'token_truncate' / 'token_mask' per step; "
                                          "'sequence_truncate' / 'sequence_mask' one ratio per trajectory, the mean "
                                          "of its log-ratios. Truncate clamps the ratio to [is_clip_min, "
                                          "is_clip_max]; mask zeroes the policy gradient of what falls outside."})
    is_clip_min: float | None = field(
        default=None, metadata={"help": "Lower bound of the importance ratio (None: no lower bound)."})
    is_clip_max: float | None = field(
        default=3.0, metadata={"help": "Upper bound of the importance ratio (TRL's 3.0; None: no upper bound)."})
    use_bias_correction_kl: bool = field(
        default=False, metadata={"help": "Weight the KL terms by the importance ratio (TRL's, True there; "
                                         "DeepSeek-V3.2's unbiased KL gradient): the paper's KL is not weighted "
                                         "(False). The token KL by pi's ratio, the action KL by rho's."})
    # ---- routing (docs/algorithm.md §1, §2 ablations, §3) ----
    routing: str = field(
        default="learned",
        metadata={"help": "Thinking-phase input rule (tarpo.algorithms.ROUTINGS, docs/algorithm.md §2-3). "
                  + "; ".join(f"'{r.name}': {r.help}" for r in ROUTINGS.values()) + "."})
    entropy_threshold: float = field(
        default=0.5, metadata={"help": "Entropy (nats, of softmax(z/entropy_temperature)) above which 'entropy' "
                                       "routing goes soft. Paper: 0.5 (Sec. 4.1 baselines, Sec. 4.3 ablation)."})
    entropy_soft_when: str = field(
        default="high", metadata={"help": "'entropy' routing goes soft where the entropy is 'high' (above "
                                          "entropy_threshold: the paper's baseline, SwiReasoning-style) or 'low' "
                                          "(below it: ThinkRouter-style)."})
    entropy_temperature: float = field(default=1.0, metadata={
        "help": "Temperature of the distribution whose entropy 'entropy' routing thresholds (Entropy-Routed, GRPO w/ "
                "Entropy Routing). 1.0: the model's own token distribution, the entropy the authors' code reports; "
                "0.5 (= T_s) thresholds the sampling distribution, which is sharper and goes soft less often."})
    action_bias: list[float] = field(
        default_factory=lambda: [4.6, 0.0],
        metadata={"help": "Router bias b0 = [hard, soft]. Paper: [2.2, 0] for Qwen2.5-3B, [4.6, 0] for "
                  "1.5B/7B/Llama (docs/algorithm.md §1, Table 6); soft probability about 10% and 1%."})
    action_temperature: float = field(
        default=1.0, metadata={"help": "tau_a in rho = softmax((W_r h + b_r)/tau_a). Paper: 1.0 (Table 6)."})
    router_init_std: float = field(default=1e-3, metadata={"help": "Std of the router weight init N(0, std); 0 gives "
                                                                   "zeros (docs/algorithm.md §1)."})
    router_lr: float = field(default=1e-4, metadata={"help": "Learning rate of the router's own parameter group. "
                                                             "Paper: 1e-4 (Qwen), 2e-6 (Llama-3.1-8B) (Table 6)."})
    router_greedy: bool = field(
        default=False, metadata={"help": "Inference only: take argmax of rho instead of sampling it "
                                         "(docs/algorithm.md §1). Training always samples."})
    soft_top_k: int = field(default=30, metadata={"help": "k of the soft mixture over top-k(z/T_s) token embeddings. "
                                                          "Paper: 30 (Table 6)."})
    answer_tag: str = field(
        default="####", metadata={"help": "Text whose emission ends the thinking phase; afterwards inputs are "
                                          "hard and no router decision is recorded (docs/algorithm.md §1, §6)."})
    hrpo_c: float = field(
        default=8.0, metadata={"help": "HRPO: c in a = exp(-c softplus(-Lambda) r) (docs/algorithm.md §3)."})
    hrpo_mixture: str = field(
        default="full", metadata={"help": "HRPO: the mixture m its gate blends with E(v_t). 'full': HRPO's code, "
                                          "m = (p . E) / |p|_2 over the whole vocabulary, p the distribution v_t "
                                          "was sampled from (one [B, V] x [V, d] product per step, recorded in "
                                          "the rollout); 'top_k': this project's earlier reading, the top-k "
                                          "(soft_top_k) mixture rescaled to |E(v_t)|."})
    hrpo_lr: float = field(default=1e-4, metadata={"help": "HRPO: learning rate of the gate's linear maps W_r, W_i "
                                                           "(HRPO's lr_residual_gate, 1e-4)."})
    hrpo_lambda_lr: float = field(default=1e-3, metadata={
        "help": "HRPO: learning rate of Lambda (HRPO's lr_residual_Lambda, 1e-3; 1e-4 reproduces this project's "
                "earlier runs). The gate's groups take weight_decay, as in HRPO's optimizer."})
    soft_tokens_noise_scale: float = field(
        default=0.33, metadata={"help": "Soft Tokens: noise std as a multiple of the embedding RMS, "
                                        "sigma = 0.33 rms(E) (docs/algorithm.md §3)."})
    gumbel_temperature: float = field(
        default=0.5, metadata={"help": "Routing 'learned_gumbel' (ALGO=tarpo_gumbel): tau_g of the Gumbel-softmax "
                                       "draw of a soft step's top-k weights, SofT-GRPO's 0.5 (docs/algorithm.md §8)."})
    # ---- objective (docs/algorithm.md §2) ----
    lambda_act: float = field(default=0.1, metadata={"help": "lambda, weight of the router policy-gradient term L_act "
                                                             "(docs/algorithm.md §2)."})
    alpha_action_kl: float = field(
        default=1.0, metadata={"help": "alpha, weight of the action KL(rho_theta || rho_ref) inside the KL "
                                       "term (docs/algorithm.md §2, Table 6)."})
    token_kl: str = field(
        default="k3", metadata={"help": "Token KL estimator: 'k3' on the step's token, or 'full' exact KL over "
                                        "the vocabulary, computed in chunks (docs/algorithm.md §2)."})
    detach_kl_weight: bool = field(
        default=True, metadata={"help": "Detach delta_t = rho(hard|h_t) weighting the token KL at thinking steps, so "
                                        "the router cannot lower the penalty by routing soft (docs/algorithm.md §2)."})
    advantage_eps: float = field(
        default=1e-4, metadata={"help": "eps in A_i = (r_i - mean r) / (std r + eps) (docs/algorithm.md §2)."})
    logprob_chunk_size: int = field(
        default=1024, metadata={"help": "Positions per chunk when scoring log-probs and the full-vocabulary KL, "
                                        "so no full fp32 [B, T, V] tensor is ever held (docs/algorithm.md §2)."})
    # ---- LoRA (docs/algorithm.md §4, Table 6) ----
    use_peft: bool = field(default=True, metadata={
        "help": "Train a LoRA adapter (the lora_* fields; the paper's) when no peft_config is passed to the trainer; "
                "False: full fine-tuning, whose reference, with beta > 0, is a frozen copy of the model loaded from "
                "its path, as TRL's GRPOTrainer loads it. A peft_config passed to the trainer is used as given."})
    lora_r: int = field(default=32, metadata={"help": "LoRA rank. Paper: 32 (Table 6)."})
    lora_alpha: int = field(default=64, metadata={"help": "LoRA alpha. Paper: 64 (Table 6)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout (0: policy and reference score "
                                                               "identically)."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        metadata={"help": "Modules that get LoRA. Paper: query, key, value, dense = q, k, v, o (Table 6); the "
                  "authors' released scripts (TARPO's and HRPO's) also adapt gate_proj, up_proj, down_proj "
                  "(launcher: LORA_TARGETS=all-linear, tarpo.runs.presets)."})
    # ---- lengths (Table 7) ----
    max_prompt_length: int = field(
        default=1024, metadata={"help": "Prompts longer than this many tokens are truncated from the left "
                                        "(the start is dropped). Paper: 1024 for training (Table 7)."})
    rollout_engine: str = field(
        default="auto", metadata={"help": "Decode engine of the rollouts: 'eager', the reference loop (any backend; "
                                          "with BACKEND=unsloth it is Unsloth's fast decode path); 'compiled', one "
                                          "static-shape step under torch.compile (CUDA graphs on CUDA) over the "
                                          "model's own tensors, any backend (tarpo.engine.static_decode); 'auto', "
                                          "the choice of tarpo.engine.engine_choice (compiled on CUDA; eager on the "
                                          "CPU unless the run's timed first rollout shows compiling repays). In "
                                          "training both engines draw the same samples (docs/rollout-engines.md)."})
    decode_merge: str = field(
        default="auto", metadata={"help": "What the compiled engine decodes with (docs/rollout-engines.md, 'Decode "
                                          "weights'): 'all' every LoRA merged into a copy of the projections that "
                                          "carry it (W + s B A, summed in fp32); 'attention' q|k|v and o's only; "
                                          "'none' the LoRA as an adapter. Weights without LoRA are never copied. "
                                          "'auto': the memory plan's choice, or without a plan the first whose copies "
                                          "and KV cache fit in 80% of the free memory."})
    compact_finished_rows: bool = field(
        default=True, metadata={"help": "Drop finished rows from the decode batch and KV cache so they stop "
                                        "costing work (docs/algorithm.md §1). Changes the random stream versus "
                                        "transformers' generate once a row ends; results stay exact."})

    def __post_init__(self):
        self.optim = resolve_optimizer(str(getattr(self.optim, "value", self.optim)))
        self.dataloader_pin_memory &= torch.cuda.is_available()  # pinned memory needs a GPU (torch warns without)
        if self.fp16:  # before transformers' checks of the device: tarpo.training.nonfinite would count the scaler's
            raise ValueError("TarpoConfig.fp16=True: not served: the loss scaler's own overflow steps would be "
                             "skipped and counted as non-finite steps (three in a row stop the run); use bf16 (the "
                             "paper's) or fp32")
        super().__post_init__()  # TRL checks generation_batch_size % num_generations, num_generations >= 2
        self.validate_tarpo()

    @property
    def rule(self) -> Routing:
        """The routing rule of ``routing`` (:data:`tarpo.algorithms.ROUTINGS`): every reader of the run's rule
        asks here."""
        return ROUTINGS[self.routing]

    @property
    def off_policy(self) -> bool:
        """A batch is used after an optimizer step: the one owner of the rule (validation below; the trainer)."""
        return self.num_iterations > 1 or self.steps_per_generation > self.gradient_accumulation_steps

    def validate_tarpo(self) -> None:
        """Raise ``ValueError`` naming the field for every invalid TARPO setting."""
        def bad(name, why):
            raise ValueError(f"TarpoConfig.{name}={getattr(self, name)!r}: {why}")

        for name in ("learning_rate", "router_lr", "hrpo_lr", "hrpo_lambda_lr", "beta", "lambda_act",
                     "alpha_action_kl", "weight_decay", "warmup_steps"):
            if getattr(self, name) < 0:
                bad(name, "must be >= 0")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            bad("max_grad_norm", "must be > 0")
        if self.lora_r < 1 or self.lora_alpha <= 0:
            bad("lora_r" if self.lora_r < 1 else "lora_alpha", "must be >= 1" if self.lora_r < 1 else "must be > 0")
        if not self.lora_target_modules:
            bad("lora_target_modules", "must name at least one module")
        if self.routing not in ROUTINGS:
            bad("routing", f"must be one of {', '.join(ROUTINGS)}")
        if self.token_kl not in TOKEN_KL_MODES:
            bad("token_kl", f"must be one of {TOKEN_KL_MODES}")
        if (problem := sampling_problem(self)) is not None:
            bad(*problem)
        if len(self.action_bias) != 2:
            bad("action_bias", "must be two numbers [hard, soft]")
        if self.router_init_std < 0:
            bad("router_init_std", "must be >= 0")
        if self.max_completion_length is None or self.max_completion_length < 1:
            bad("max_completion_length", "must be >= 1")
        for name in ("max_prompt_length", "logprob_chunk_size"):
            if getattr(self, name) < 1:
                bad(name, "must be >= 1")
        if self.rollout_engine not in ENGINES:
            bad("rollout_engine", f"must be one of {', '.join(ENGINES)}")
        if self.decode_merge not in DECODE_MERGES:
            bad("decode_merge", f"must be one of {', '.join(DECODE_MERGES)}")
        if not self.answer_tag:
            bad("answer_tag", "must be a non-empty string")
        if self.hrpo_c <= 0:
            bad("hrpo_c", "must be > 0")
        if self.soft_tokens_noise_scale <= 0:
            bad("soft_tokens_noise_scale", "must be > 0")
        if self.rule.soft.log_density and self.off_policy:
            bad("num_iterations" if self.num_iterations > 1 else "steps_per_generation",
                f"routing {self.routing!r} scores its soft inputs' draw on-policy only (one optimizer step a batch)")
        if self.max_nonfinite_steps < 1:
            bad("max_nonfinite_steps", "must be >= 1")
        try:
            signal_numbers(self.save_on_signals)
        except ValueError as exc:
            bad("save_on_signals", str(exc))
        if self.gumbel_temperature <= 0:
            bad("gumbel_temperature", "must be > 0")
        if self.hrpo_mixture not in HRPO_MIXTURES:
            bad("hrpo_mixture", f"must be one of {HRPO_MIXTURES}")
        self.validate_loss()
        if set(self.generation_kwargs or {}) - {"min_p"}:
            bad("generation_kwargs", "the hybrid decode loop serves min_p of generate()'s arguments; not "
                                     f"{', '.join(sorted(set(self.generation_kwargs) - {'min_p'}))}")
        if self.multi_objective_aggregation not in ("sum_then_normalize", "normalize_then_sum"):
            bad("multi_objective_aggregation", "must be sum_then_normalize or normalize_then_sum")
        for name, (value, why) in PINNED.items():
            if getattr(self, name) != value:
                bad(name, f"TarpoTrainer runs only {value!r}: {why}")

    def validate_loss(self) -> None:
        """The loss variants and the mismatch correction (docs/algorithm.md §8)."""
        def bad(name, why):
            raise ValueError(f"TarpoConfig.{name}={getattr(self, name)!r}: {why}")

        self.scale_rewards = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)  # TRL's bools
        for name, allowed in (("loss_type", LOSS_TYPES), ("scale_rewards", SCALE_REWARDS),
                              ("importance_sampling_level", IS_LEVELS), ("is_correction", IS_CORRECTIONS)):
            if getattr(self, name) not in allowed:
                bad(name, f"must be one of {', '.join(allowed)}")
        if self.epsilon_high is not None and self.epsilon_high < 0:
            bad("epsilon_high", "must be >= 0")
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            bad("top_entropy_quantile", "must be in [0, 1] (1: every step)")
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            if not getattr(self, name) > 0:
                bad(name, "must be > 0")
        for name in ("is_clip_min", "is_clip_max"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                bad(name, "must be > 0 (or None: no bound)")
        if None not in (self.is_clip_min, self.is_clip_max) and self.is_clip_min >= self.is_clip_max:
            bad("is_clip_min", f"must be below is_clip_max={self.is_clip_max}")
        if self.is_correction != "none" and self.off_policy:
            bad("is_correction", "corrects on-policy training only (one optimizer step a batch): a reused batch's "
                                 "clipped ratio is already taken against the rollout's own log-probs")


def default(name: str):
    """The default of the TarpoConfig field ``name``: the one place each default is written. The
    rollout settings (:class:`tarpo.engine.rollout.RolloutSpec`), the launchers (:mod:`tarpo.runs.presets`) and
    the flags of ``tarpo eval`` / ``tarpo case`` read it here.

        >>> default("soft_top_k"), default("action_bias")
        (30, [4.6, 0.0])
    """
    f = TarpoConfig.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not MISSING else f.default


def add_flags(parser, names, from_run=(), **helps) -> None:
    """``--name-with-dashes`` flags for TarpoConfig fields: the field's type, default and help
    (``helps[name]`` replaces a help). The flags of ``from_run`` default to None: the trained run's value, read
    beside its adapter (tarpo.evaluation.system.fill_run_settings), else the field's default."""
    for name in names:
        value = default(name)
        text = helps.get(name) or TarpoConfig.__dataclass_fields__[name].metadata.get("help")
        if name in from_run:
            text = f"{text} Default: the trained run's (its adapter's routing_settings.json), else {value}."
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=None if name in from_run
                            else value, help=text)
