"""TARPO's configuration: TRL's ``GRPOConfig`` plus every knob of the method, in one class.

``TarpoConfig`` is three groups of fields, one dataclass: the fields it inherits from TRL with the paper's values
(here; each field of ``GRPOConfig`` is pinned, honoured or inert, :mod:`tarpo.trl_fields`), the method's knobs beside
their equations (:class:`tarpo.method_fields.MethodFields`) and the project's engineering settings
(:class:`tarpo.engineering_fields.EngineeringFields`). Each field cites where its default comes from:
"docs/algorithm.md §n" is this project's account of the method, "Table 6" / "Table 7" the paper's hyper-parameter
and length tables (Appendix A). Defaults are the paper's values for Qwen2.5-1.5B/7B on MATH; the launchers override
them per model and data set.
"""

from __future__ import annotations

import itertools
from dataclasses import MISSING, dataclass, field

import torch
from trl import GRPOConfig

from .engineering_fields import EngineeringFields
from .losses import LOSS_TYPES, LOSSES  # the loss variants' table owns their names
from .method_fields import MethodFields
from .trl_fields import PINNED  # the inherited fields pinned to what runs (with the honoured and the inert)

SCALE_REWARDS = ("group", "batch", "none")       # tarpo.training.advantages.group_advantages
IS_LEVELS = ("token", "sequence")                # tarpo.losses.importance_ratio


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
class TarpoConfig(EngineeringFields, MethodFields, GRPOConfig):
    # fields: GRPOConfig's (those below with the paper's values), then MethodFields', then EngineeringFields'
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
    use_bias_correction_kl: bool = field(
        default=False, metadata={"help": "Weight the KL terms by the importance ratio (TRL's, True there; "
                                         "DeepSeek-V3.2's unbiased KL gradient): the paper's KL is not weighted "
                                         "(False). The token KL by pi's ratio, the action KL by rho's."})

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
    def off_policy(self) -> bool:
        """A batch is used after an optimizer step: the one owner of the rule (validation below; the trainer)."""
        return self.num_iterations > 1 or self.steps_per_generation > self.gradient_accumulation_steps

    def validate_tarpo(self) -> None:
        """Raise ``ValueError`` naming the field for the first invalid setting: the inherited fields', the method's
        (:meth:`MethodFields.method_problems`), the engineering settings' and the rules across them."""
        self.scale_rewards = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)  # TRL's bools
        for name, why in itertools.chain(self.inherited_problems(), self.method_problems(),
                                         self.engineering_problems(), self.joint_problems()):  # lazily: the first
            raise ValueError(f"TarpoConfig.{name}={getattr(self, name)!r}: {why}")

    def inherited_problems(self):
        """``(field, why)`` for each invalid setting of a field inherited from TRL: the paper's training settings,
        the loss variants (docs/algorithm.md §8), the pinned fields."""
        for name in ("learning_rate", "beta", "weight_decay", "warmup_steps"):
            if getattr(self, name) < 0:
                yield name, "must be >= 0"
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            yield "max_grad_norm", "must be > 0"
        if self.max_completion_length is None or self.max_completion_length < 1:
            yield "max_completion_length", "must be >= 1"
        for name, allowed in (("loss_type", LOSS_TYPES), ("scale_rewards", SCALE_REWARDS),
                              ("importance_sampling_level", IS_LEVELS)):
            if getattr(self, name) not in allowed:
                yield name, f"must be one of {', '.join(allowed)}"
        if self.epsilon_high is not None and self.epsilon_high < 0:
            yield "epsilon_high", "must be >= 0"
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            yield "top_entropy_quantile", "must be in [0, 1] (1: every step)"
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            if not getattr(self, name) > 0:
                yield name, "must be > 0"
        if set(self.generation_kwargs or {}) - {"min_p"}:
            yield "generation_kwargs", ("the hybrid decode loop serves min_p of generate()'s arguments; not "
                                        f"{', '.join(sorted(set(self.generation_kwargs) - {'min_p'}))}")
        if self.multi_objective_aggregation not in ("sum_then_normalize", "normalize_then_sum"):
            yield "multi_objective_aggregation", "must be sum_then_normalize or normalize_then_sum"
        for name, (value, why) in PINNED.items():
            if getattr(self, name) != value:
                yield name, f"TarpoTrainer runs only {value!r}: {why}"

    def joint_problems(self):
        """The rules between the method and TRL's batching: what must be trained on-policy."""
        if self.rule.soft.log_density and self.off_policy:
            yield ("num_iterations" if self.num_iterations > 1 else "steps_per_generation", f"routing "
                   f"{self.routing!r} scores its soft inputs' draw on-policy only (one optimizer step a batch)")
        if self.is_correction != "none" and self.off_policy:
            yield "is_correction", ("corrects on-policy training only (one optimizer step a batch): a reused batch's "
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
