"""The TARPO objective of docs/algorithm.md §2, what it computes: its settings (:class:`LossSettings`), the tensors it
reads (:class:`LossBatch`) and the loss (:func:`tarpo_loss`), to be read beside that section.

Shapes: ``[B, T]`` per trajectory and completion step, ``[B]`` per trajectory. Masks are
bool. Nothing here touches a model: :mod:`tarpo.training.scoring` produces the log-probs, and
:mod:`tarpo.training.loss_inputs` builds the batch from a recorded rollout (masks, mismatch weights, the
off-policy mask) and calls the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import default
from ..losses import LOSSES, importance_ratio, loss_variant


@dataclass(frozen=True)
class LossSettings:
    """What :func:`tarpo_loss` is computed with besides the batch's tensors: built once per run from the
    :class:`tarpo.config.TarpoConfig` (:meth:`of`). Defaults are the paper's; an unknown ``loss_type`` is
    refused at construction, naming it."""

    lambda_act: float                      # lambda, weight of the router term L_act (docs/algorithm.md §2)
    beta: float                            # beta, weight of L_KL
    alpha: float                           # alpha, weight of the action KL inside L_KL
    use_router: bool = True                # False: routing hard / soft / entropy, no router terms, delta_t = 1
    detach_kl_weight: bool = True          # delta_t = rho(hard|h_t) detached
    token_loss_on_soft: bool = False       # HRPO: the token term at every step (the token was fed blended)
    loss_type: str = "grpo"                # an entry of tarpo.losses.LOSSES
    level: str = "token"                   # importance_sampling_level of the token and the router ratios
    clip_eps: float = default("epsilon")
    clip_eps_high: float | None = None     # None: clip_eps
    sapo_temperature_pos: float = default("sapo_temperature_pos")
    sapo_temperature_neg: float = default("sapo_temperature_neg")
    max_completion_length: int | None = None  # dr_grpo's divisor
    top_entropy_quantile: float = 1.0      # < 1: the token term at the high-entropy steps only (high_entropy_mask)
    is_correction: str = "none"            # the rollout/training mismatch's weights (mismatch_weights)
    is_clip_min: float | None = None       # ... their clamp or mask bounds
    is_clip_max: float | None = None
    off_policy: bool = False               # a batch reused after optimizer steps: ratios to the rollout's log-probs
    mask_truncated_completions: bool = False  # only the steps of completions that ended (loss_mask)
    # TRL's options of its loss, computed as TRL computes them (docs/algorithm.md §8, "TRL's loss options")
    delta: float | None = None             # two-sided clipping: the unclipped ratio capped at delta too
    vespo: tuple = (2.0, 3.0, 3.0, 2.0)    # loss_type vespo: k_pos, lambda_pos, k_neg, lambda_neg
    entropy_coef: float = 0.0              # entropy bonus: loss - coef * mean entropy of the token distribution
    adaptive_entropy: bool = False         # the bonus's entropy measured at every coefficient (use_adaptive_entropy)
    bias_correction_kl: bool = False       # the KL terms weighted by the importance ratio (use_bias_correction_kl)
    off_policy_mask_threshold: float | None = None  # rows with A < 0 whose mean KL(rollout || now) is above: dropped

    def __post_init__(self):
        loss_variant(self.loss_type)

    @property
    def variant(self):
        return LOSSES[self.loss_type]

    @classmethod
    def of(cls, args) -> "LossSettings":
        """The settings of a run's config (a :class:`tarpo.config.TarpoConfig`); the routing rule says whether
        the router terms exist and whether soft steps carry the token term."""
        rule = args.rule
        return cls(lambda_act=args.lambda_act, beta=args.beta, alpha=args.alpha_action_kl, use_router=rule.router,
                   detach_kl_weight=args.detach_kl_weight, token_loss_on_soft=rule.soft.feeds_token,
                   loss_type=args.loss_type, level=args.importance_sampling_level, clip_eps=args.epsilon,
                   clip_eps_high=args.epsilon_high, sapo_temperature_pos=args.sapo_temperature_pos,
                   sapo_temperature_neg=args.sapo_temperature_neg, max_completion_length=args.max_completion_length,
                   top_entropy_quantile=args.top_entropy_quantile, is_correction=args.is_correction,
                   is_clip_min=args.is_clip_min, is_clip_max=args.is_clip_max, off_policy=args.off_policy,
                   mask_truncated_completions=args.mask_truncated_completions, delta=args.delta,
                   vespo=(args.vespo_k_pos, args.vespo_lambda_pos, args.vespo_k_neg, args.vespo_lambda_neg),
                   entropy_coef=args.entropy_coef, adaptive_entropy=args.use_adaptive_entropy,
                   bias_correction_kl=args.use_bias_correction_kl,
                   off_policy_mask_threshold=args.off_policy_mask_threshold)


@dataclass
class LossBatch:
    """The batch's tensors :func:`tarpo_loss` reads besides the current policy's scores: [B, T] unless said.
    :func:`rollout_loss` builds it from a recorded rollout."""

    advantages: torch.Tensor               # [B]
    completion_mask: torch.Tensor          # the steps in the loss (loss_mask)
    is_soft: torch.Tensor
    decided: torch.Tensor                  # the thinking steps, where the router chose the next input
    old_logp_tok: torch.Tensor | None = None  # off-policy: the rollout's log pi of its tokens
    old_logp_act: torch.Tensor | None = None  # ... and log rho of its routing actions
    num_units: float | None = None         # units of the whole generation batch (the "dapo" / "bnpo" divisor)
    is_weights: tuple | None = None        # (token, router) mismatch weights [B, T], detached (mismatch_weights)
    entropy_mask: torch.Tensor | None = None  # the token term's steps (high_entropy_mask)
    rows_kept: torch.Tensor | None = None  # [B, 1]: 0 for a row the off-policy mask drops (off_policy_mask_threshold)


def steps_fed_their_token(settings: LossSettings, mask: torch.Tensor, is_soft: torch.Tensor) -> torch.Tensor:
    """The steps whose sampled token was fed to the model, which carry the token term: the hard ones, or every
    step where the routing feeds a soft step's token too (HRPO's blend: ``token_loss_on_soft``)."""
    return mask if settings.token_loss_on_soft else mask & ~is_soft


def tarpo_loss(settings: LossSettings, scores, batch: LossBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The TARPO loss (docs/algorithm.md §2), averaged over the trajectories of the batch::

        L_tok_i = -(1/T_i) sum_t 1[d_t = hard] log pi(v_t|s_t) A_i
        L_act_i = -(1/T_i) sum_{t in thinking} log rho(d_t|h_t) A_i
        L_KL_i  =  (1/T_i) sum_t [delta_t KL_tok_t + alpha 1[t in thinking] KL_act_t]
        L       =  mean_i [L_tok_i + lambda L_act_i + beta L_KL_i]

    with ``T_i`` the trajectory's units (hard + soft), thinking steps = ``decided`` (steps
    where the router chose the next input), ``delta_t = rho(hard|h_t)`` at thinking steps
    (detached unless ``settings.detach_kl_weight`` is False) and 1 elsewhere. ``mean_i`` over a batch of
    whole groups equals the mean over groups of ``(1/G) sum_i``. ``settings`` (:class:`LossSettings`) gives
    lambda, beta, alpha and the variant; the rest are the batch's tensors.

    Without a learned router (``settings.use_router`` False: routing hard / soft / entropy) the
    action terms vanish and delta_t = 1; soft steps still leave L_tok (their token is a
    placeholder that was never fed to the model).

    The latent baselines of docs/algorithm.md §3 generalise which steps carry the policy gradient
    of L_tok: HRPO (``settings.token_loss_on_soft``) feeds v_t blended into every input, so
    1[d_t = hard] becomes 1 at every step; Soft Tokens (``scores.logp_soft_input``, [B, T]) adds
    ``1[d_t = soft] log N(u_t; mu_theta(s_t), sigma^2 I)``, the log-likelihood of the
    noisy input it fed (on-policy only).

    ``settings.loss_type`` (:data:`tarpo.losses.LOSSES`) gives the per-step surrogate of the token term and of
    the router term alike, each with its own ratio (pi's, rho's) at ``settings.level``, and of the latent term
    (on-policy, per step), and aggregates every term the same way (its ``aggregate``; ``grpo`` is the formula
    above). ``batch.is_weights`` = (token weights, router weights) [B, T], detached, multiply the two policy-gradient
    terms (:func:`mismatch_weights`; the KL terms are not weighted). ``batch.entropy_mask`` [B, T]
    (:func:`high_entropy_mask`) keeps the token term at its steps only; the router and KL terms keep every step
    (docs/algorithm.md §8).

    ``scores`` (a :class:`tarpo.training.scoring.StepScores`, [B, T] each): ``logp_tok``, ``logp_act`` log rho of
    the action taken, ``p_hard``, ``kl_tok`` the per-step token KL (k3 or full), ``kl_act`` the per-step
    KL(rho || rho_ref), ``logp_soft_input``; ``batch`` (:class:`LossBatch`) the rest. Returns the scalar loss and
    its per-term means (detached).

    TRL's options, as TRL computes them for its token term, here for the router term too: ``batch.rows_kept`` (the
    off-policy sequence mask) multiplies both policy-gradient terms; ``bias_correction_kl`` weights the token KL by
    pi's ratio, the action KL by rho's; ``entropy_coef`` subtracts ``coef`` x the mean entropy over the loss's steps
(``adaptive_entropy``: the coefficient of this micro-batch, the entropy measured even at 0).
    """
    b, variant = batch, settings.variant
    mask, advantages = b.completion_mask, b.advantages
    token_steps = steps_fed_their_token(settings, mask, b.is_soft)
    thinking = mask & b.decided if settings.use_router else torch.zeros_like(mask)
    w_tok, w_act = b.is_weights if b.is_weights is not None else (1.0, 1.0)

    def total(per_step):
        return variant.aggregate(per_step * mask.float(), mask, settings.max_completion_length, b.num_units)

    pg_tok = variant.surrogate(scores.logp_tok, advantages, b.old_logp_tok, token_steps, settings.level, settings)
    per_tok = pg_tok * w_tok * token_steps
    if scores.logp_soft_input is not None:
        if b.old_logp_tok is not None:
            raise ValueError("the Soft Tokens term is on-policy only (one gradient step per batch)")
        soft = mask & b.is_soft
        per_tok = per_tok + variant.surrogate(scores.logp_soft_input, advantages, None, soft, "token", settings) * soft
    if b.entropy_mask is not None:
        per_tok = per_tok * b.entropy_mask
    kept = b.rows_kept if b.rows_kept is not None else 1.0
    per_tok = per_tok * kept
    ones = torch.ones_like(scores.logp_tok)
    per_act = per_kl_act = torch.zeros_like(scores.logp_tok)
    delta = ones
    if settings.use_router:
        pg_act = variant.surrogate(scores.logp_act, advantages, b.old_logp_act, thinking, settings.level, settings)
        per_act = pg_act * w_act * thinking * kept
        delta = torch.where(thinking, scores.p_hard.detach() if settings.detach_kl_weight else scores.p_hard, ones)
        per_kl_act = scores.kl_act * thinking
        if settings.bias_correction_kl:
            per_kl_act = per_kl_act * importance_ratio(scores.logp_act, b.old_logp_act, settings.level, thinking)
    kl_tok = scores.kl_tok
    if settings.bias_correction_kl:
        kl_tok = kl_tok * importance_ratio(scores.logp_tok, b.old_logp_tok, settings.level, mask)
    l_tok, l_act = total(per_tok), total(per_act)
    kl_tok_sum, kl_act_sum = total(delta * kl_tok), total(per_kl_act)
    l_kl = kl_tok_sum + settings.alpha * kl_act_sum
    loss = l_tok + settings.lambda_act * l_act + settings.beta * l_kl
    terms = {"loss_tok": l_tok, "loss_act": l_act, "loss_kl": l_kl, "kl_tok": kl_tok_sum, "kl_act": kl_act_sum}
    if settings.entropy_coef or settings.adaptive_entropy:  # TRL's bonus: loss = policy_loss - coef * entropy
        steps = mask if b.entropy_mask is None else mask & b.entropy_mask.bool()
        terms["entropy_bonus"] = (scores.entropy * steps).sum() / steps.sum().clamp(min=1)  # with its gradient
        terms["policy_loss"] = loss  # logged whenever the bonus is on, as TRL logs it (adaptive: at coefficient 0 too)
        if settings.adaptive_entropy:  # the controller's window is a mean over steps (tarpo.training.trainer_entropy)
            terms["entropy_steps"] = steps.sum()
    if settings.entropy_coef:
        terms["entropy_coef"] = loss.new_tensor(settings.entropy_coef)
        loss = loss - settings.entropy_coef * terms["entropy_bonus"]
    return loss, {k: v.detach() for k, v in terms.items()}
