"""TARPO's configuration: TRL's ``GRPOConfig`` plus every knob of the method.

Each field cites where its default comes from: "DESIGN §n" is ``shared/DESIGN.md`` of
this project, "Tab. A" the paper's hyper-parameter table (Appendix A, DESIGN §5).
Defaults are the paper's values for Qwen2.5-1.5B/7B on MATH; the launchers override
them per model and data set.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

ROUTING_MODES = ("learned", "hard", "soft", "entropy", "hrpo", "soft_tokens")
LATENT_ROUTINGS = ("hrpo", "soft_tokens")  # baselines whose soft steps are not a plain mixture (DESIGN §3)
TOKEN_KL_MODES = ("k3", "full")
HARD, SOFT = 0, 1  # router action indices (DESIGN §1: index 0 = hard, 1 = soft)


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
    # ---- TRL/Trainer fields whose defaults are the paper's (Tab. A) ----
    learning_rate: float = field(default=5e-6, metadata={"help": "Backbone (LoRA) LR. Paper: 5e-6 Qwen, 2e-6 Llama (Tab. A)."})
    temperature: float = field(default=0.5, metadata={"help": "Sampling temperature T_s; log-probs are scored at it. Paper: 0.5 (Tab. A)."})
    top_k: int = field(default=0, metadata={"help": "Top-k filter of the token policy; 0 = off, stated explicitly (DESIGN §1)."})
    top_p: float = field(default=1.0, metadata={"help": "Top-p filter of the token policy; 1.0 = off, stated explicitly (DESIGN §1)."})
    beta: float = field(default=0.005, metadata={"help": "beta, weight of the KL term L_KL (DESIGN §2, Tab. A)."})
    num_generations: int | None = field(default=8, metadata={"help": "Group size G. Paper: 4 GSM8K, 8 MATH/DAPO (Tab. A)."})
    max_completion_length: int | None = field(default=1024, metadata={"help": "Max generated units (hard + soft). Paper: 1024 GSM8K/MATH, 2048 DAPO (Tab. A)."})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay. Paper: 0.1 (Tab. A)."})
    adam_beta2: float = field(default=0.99, metadata={"help": "AdamW beta2. Paper: 0.99 (Tab. A)."})
    max_grad_norm: float = field(default=0.1, metadata={"help": "Gradient clipping norm. Paper: 0.1 (Tab. A)."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "LR schedule. Paper: cosine (Tab. A)."})
    warmup_steps: float = field(default=0.1, metadata={"help": "Linear warm-up: a fraction of the steps if < 1, else a "
                                                        "step count (transformers 5 has no warmup_ratio). Paper: "
                                                        "ratio 0.1 (Tab. A)."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Epochs. Paper: 1 (Tab. A)."})
    optim: str = field(
        default="paged_adamw_8bit",
        metadata={"help": "Optimizer. Paper: 8-bit AdamW, paged_adamw_8bit (DESIGN §4). Resolved at construction: "
                  "without CUDA the non-paged adamw_bnb_8bit (bitsandbytes steps CPU tensors); without a working "
                  "bitsandbytes plain adamw_torch with the same hyper-parameters."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N optimizer steps (every step by default)."})
    disable_dropout: bool = field(default=True, metadata={"help": "Dropout off so policy and reference score the same inputs identically."})
    # ---- routing (DESIGN §1, §2 ablations, §3) ----
    routing: str = field(
        default="learned",
        metadata={"help": "Thinking-phase input rule. 'learned': the router samples hard/soft (TARPO); "
                  "'hard': always the sampled token (GRPO, CoT); 'soft': always the top-k mixture "
                  "(Pure Latent); 'entropy': soft iff token entropy > entropy_threshold (Entropy "
                  "Routing); 'hrpo': HRPO's gated blend of E(v_t) and the mixture at every thinking step; "
                  "'soft_tokens': the full mixture plus Gaussian noise at every thinking step (Soft Tokens). "
                  "DESIGN §2-3."})
    entropy_threshold: float = field(
        default=0.5, metadata={"help": "Entropy (nats, of softmax(z/T_s)) above which 'entropy' routing "
                                       "goes soft. Paper: 0.5 (DESIGN §2)."})
    action_bias: list[float] = field(
        default_factory=lambda: [4.6, 0.0],
        metadata={"help": "Router bias b0 = [hard, soft]. Paper: [2.2, 0] for Qwen2.5-3B, [4.6, 0] for "
                  "1.5B/7B/Llama (DESIGN §1, Tab. A); soft probability about 10% and 1%."})
    action_temperature: float = field(
        default=1.0, metadata={"help": "tau_a in rho = softmax((W_r h + b_r)/tau_a). Paper: 1.0 (Tab. A)."})
    router_init_std: float = field(
        default=1e-3, metadata={"help": "Std of the router weight init N(0, std); 0 gives zeros (DESIGN §1)."})
    router_lr: float = field(
        default=1e-4, metadata={"help": "Learning rate of the router's own parameter group. Paper: 1e-4 "
                                        "(Qwen), 2e-6 (Llama-3.1-8B) (Tab. A)."})
    router_greedy: bool = field(
        default=False, metadata={"help": "Inference only: take argmax of rho instead of sampling it "
                                         "(DESIGN §1). Training always samples."})
    soft_top_k: int = field(
        default=30, metadata={"help": "k of the soft mixture over top-k(z/T_s) token embeddings. Paper: 30 "
                                      "(Tab. A)."})
    answer_tag: str = field(
        default="####", metadata={"help": "Text whose emission ends the thinking phase; afterwards inputs are "
                                          "hard and no router decision is recorded (DESIGN §1, §6)."})
    hrpo_c: float = field(
        default=8.0, metadata={"help": "HRPO: c in a = exp(-c softplus(-Lambda) r) (DESIGN §3)."})
    hrpo_lr: float = field(
        default=1e-4, metadata={"help": "HRPO: learning rate of the gate's own parameter group (W_r, W_i, Lambda; "
                                        "no weight decay). Our choice: the router's LR."})
    soft_tokens_noise_scale: float = field(
        default=0.33, metadata={"help": "Soft Tokens: noise std as a multiple of the embedding RMS, "
                                        "sigma = 0.33 rms(E) (DESIGN §3)."})
    # ---- objective (DESIGN §2) ----
    lambda_act: float = field(
        default=0.1, metadata={"help": "lambda, weight of the router policy-gradient term L_act (DESIGN §2)."})
    alpha_action_kl: float = field(
        default=1.0, metadata={"help": "alpha, weight of the action KL(rho_theta || rho_ref) inside the KL "
                                       "term (DESIGN §2, Tab. A)."})
    token_kl: str = field(
        default="k3", metadata={"help": "Token KL estimator: 'k3' on the step's token, or 'full' exact KL over "
                                        "the vocabulary, computed in chunks (DESIGN §2)."})
    detach_kl_weight: bool = field(
        default=True, metadata={"help": "Detach delta_t = rho(hard|h_t) weighting the token KL at thinking "
                                        "steps, so the router cannot lower the penalty by routing soft "
                                        "(DESIGN §2)."})
    advantage_eps: float = field(
        default=1e-4, metadata={"help": "eps in A_i = (r_i - mean r) / (std r + eps) (DESIGN §2)."})
    logprob_chunk_size: int = field(
        default=1024, metadata={"help": "Positions per chunk when scoring log-probs and the full-vocabulary KL, "
                                        "so no full fp32 [B, T, V] tensor is ever held (DESIGN §2)."})
    # ---- LoRA (DESIGN §4, Tab. A) ----
    lora_r: int = field(default=32, metadata={"help": "LoRA rank. Paper: 32 (Tab. A)."})
    lora_alpha: int = field(default=64, metadata={"help": "LoRA alpha. Paper: 64 (Tab. A)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout (0: policy and reference score identically)."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        metadata={"help": "Modules that get LoRA. Paper: q, k, v, o (Tab. A)."})
    # ---- lengths (Tab. A) ----
    max_prompt_length: int = field(
        default=1024, metadata={"help": "Prompts longer than this many tokens are truncated from the left "
                                        "(the start is dropped). Paper: 1024 for training (Tab. A)."})
    compact_finished_rows: bool = field(
        default=True, metadata={"help": "Drop finished rows from the decode batch and KV cache so they stop "
                                        "costing work (DESIGN §1). Changes the random stream versus "
                                        "transformers' generate once a row ends; results stay exact."})

    def __post_init__(self):
        self.optim = resolve_optimizer(str(getattr(self.optim, "value", self.optim)))
        super().__post_init__()  # TRL checks generation_batch_size % num_generations, num_generations >= 2
        self.validate_tarpo()

    def validate_tarpo(self) -> None:
        """Raise ``ValueError`` naming the field for every invalid TARPO setting."""
        def bad(name, why):
            raise ValueError(f"TarpoConfig.{name}={getattr(self, name)!r}: {why}")

        for name in ("learning_rate", "router_lr", "hrpo_lr", "beta", "lambda_act", "alpha_action_kl",
                     "weight_decay", "entropy_threshold", "warmup_steps"):
            if getattr(self, name) < 0:
                bad(name, "must be >= 0")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            bad("max_grad_norm", "must be > 0")
        if self.lora_r < 1 or self.lora_alpha <= 0:
            bad("lora_r" if self.lora_r < 1 else "lora_alpha", "must be >= 1" if self.lora_r < 1 else "must be > 0")
        if not self.lora_target_modules:
            bad("lora_target_modules", "must name at least one module")
        if self.routing not in ROUTING_MODES:
            bad("routing", f"must be one of {ROUTING_MODES}")
        if self.token_kl not in TOKEN_KL_MODES:
            bad("token_kl", f"must be one of {TOKEN_KL_MODES}")
        if not isinstance(self.soft_top_k, int) or self.soft_top_k < 1:
            bad("soft_top_k", "must be an integer >= 1")
        if self.top_k is None or self.top_k < 0:
            bad("top_k", "must be >= 0 (0 disables top-k filtering)")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if self.temperature <= 0:
            bad("temperature", "must be > 0 (the log-probs are scored at this temperature)")
        if self.action_temperature <= 0:
            bad("action_temperature", "must be > 0")
        if len(self.action_bias) != 2:
            bad("action_bias", "must be two numbers [hard, soft]")
        if self.router_init_std < 0:
            bad("router_init_std", "must be >= 0")
        if self.max_prompt_length < 1:
            bad("max_prompt_length", "must be >= 1")
        if self.max_completion_length is None or self.max_completion_length < 1:
            bad("max_completion_length", "must be >= 1")
        if self.logprob_chunk_size < 1:
            bad("logprob_chunk_size", "must be >= 1")
        if not self.answer_tag:
            bad("answer_tag", "must be a non-empty string")
        if self.hrpo_c <= 0:
            bad("hrpo_c", "must be > 0")
        if self.soft_tokens_noise_scale <= 0:
            bad("soft_tokens_noise_scale", "must be > 0")
        if self.routing == "soft_tokens" and self.num_iterations > 1:
            bad("num_iterations", "Soft Tokens' Gaussian term is on-policy only (one gradient step per batch)")
        if self.use_vllm:
            bad("use_vllm", "TARPO generates with its own hybrid decode loop; vLLM cannot feed soft inputs")
