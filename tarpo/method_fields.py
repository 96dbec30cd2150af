"""The method's knobs of :class:`tarpo.config.TarpoConfig`, each beside its equation: the routing rule and the router
(rho = softmax((W_r h + b_r)/tau_a), docs/algorithm.md §1), the soft mixture, the baselines' own knobs (HRPO, Soft
Tokens, Gumbel; §3), the objective's weights (Eqs. 4-8, §2), the rollout/training mismatch (§8), LoRA and the
prompt length (Tables 6 and 7).

:class:`MethodFields` is a dataclass mixin: ``TarpoConfig`` is still the one class a user builds and TRL reads
(its fields, ``to_dict``, ``HfArgumentParser``). The fields TARPO inherits from TRL and gives the paper's values
stay on ``TarpoConfig`` itself, so that one place lists every TRL default it changes (docs/design-notes.md's table).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .algorithms import HRPO_MIXTURES, ROUTINGS, Routing

TOKEN_KL_MODES = ("k3", "full")
IS_CORRECTIONS = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
ENTROPY_SIDES = ("high", "low")                  # 'entropy' routing: soft where the entropy is above / below


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


@dataclass
class MethodFields:
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
                  "(launcher: LORA_TARGETS=all-linear, tarpo.runs.launch_variables)."})
    # ---- lengths (Table 7) ----
    max_prompt_length: int = field(
        default=1024, metadata={"help": "Prompts longer than this many tokens are truncated from the left "
                                        "(the start is dropped). Paper: 1024 for training (Table 7)."})

    @property
    def rule(self) -> Routing:
        """The routing rule of ``routing`` (:data:`tarpo.algorithms.ROUTINGS`): every reader of the run's rule
        asks here."""
        return ROUTINGS[self.routing]

    def method_problems(self):
        """``(field, why)`` for each invalid method setting, in order (TarpoConfig refuses the first); the sampling
        settings' rule is :func:`sampling_problem`'s."""
        for name in ("router_lr", "hrpo_lr", "hrpo_lambda_lr", "lambda_act", "alpha_action_kl"):
            if getattr(self, name) < 0:
                yield name, "must be >= 0"
        if self.lora_r < 1 or self.lora_alpha <= 0:
            yield ("lora_r", "must be >= 1") if self.lora_r < 1 else ("lora_alpha", "must be > 0")
        if not self.lora_target_modules:
            yield "lora_target_modules", "must name at least one module"
        if self.routing not in ROUTINGS:
            yield "routing", f"must be one of {', '.join(ROUTINGS)}"
        if self.token_kl not in TOKEN_KL_MODES:
            yield "token_kl", f"must be one of {TOKEN_KL_MODES}"
        if (problem := sampling_problem(self)) is not None:
            yield problem
        if len(self.action_bias) != 2:
            yield "action_bias", "must be two numbers [hard, soft]"
        if self.router_init_std < 0:
            yield "router_init_std", "must be >= 0"
        if self.max_prompt_length < 1:
            yield "max_prompt_length", "must be >= 1"
        if not self.answer_tag:
            yield "answer_tag", "must be a non-empty string"
        for name in ("hrpo_c", "soft_tokens_noise_scale", "gumbel_temperature"):
            if getattr(self, name) <= 0:
                yield name, "must be > 0"
        if self.hrpo_mixture not in HRPO_MIXTURES:
            yield "hrpo_mixture", f"must be one of {HRPO_MIXTURES}"
        if self.is_correction not in IS_CORRECTIONS:
            yield "is_correction", f"must be one of {', '.join(IS_CORRECTIONS)}"
        for name in ("is_clip_min", "is_clip_max"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                yield name, "must be > 0 (or None: no bound)"
        if None not in (self.is_clip_min, self.is_clip_max) and self.is_clip_min >= self.is_clip_max:
            yield "is_clip_min", f"must be below is_clip_max={self.is_clip_max}"
