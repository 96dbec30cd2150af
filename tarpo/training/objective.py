"""The TARPO objective of docs/algorithm.md §2 as pure functions of per-step tensors.

Shapes: ``[B, T]`` per trajectory and completion step, ``[B]`` per trajectory. Masks are
bool. Nothing here touches a model: :mod:`tarpo.training.scoring` produces the log-probs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..config import IS_CORRECTIONS, default
from ..losses import LOSSES, importance_ratio, loss_variant
from .metrics import logp_drift


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
                   entropy_coef=args.entropy_coef, bias_correction_kl=args.use_bias_correction_kl,
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


def loss_mask(settings: LossSettings, rollout) -> torch.Tensor:
    """The steps in the loss: all of them, or with ``mask_truncated_completions`` those of completions that ended."""
    if settings.mask_truncated_completions:
        return rollout.completion_mask & rollout.ended_with_eos[:, None]
    return rollout.completion_mask


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float, gather=None) -> torch.Tensor:
    """The steps of ``mask`` whose entropy is at least the ``1 - quantile`` quantile of the entropies at the
    steps of ``mask`` of the whole batch: the top ``quantile`` of the steps by entropy ("Beyond the 80/20 rule",
    arXiv:2506.01939; TRL's ``get_high_entropy_mask`` for ``top_entropy_quantile``). ``gather``: this process's
    1-D values -> every process's (:func:`tarpo.training.distributed.all_values`), so that every process
    thresholds at the same value. ``quantile`` 1 keeps every step, 0 the highest only.

        >>> e = torch.tensor([[0.1, 2.0, 0.5], [1.0, 0.0, 9.0]])
        >>> high_entropy_mask(e, torch.tensor([[True, True, True], [True, True, False]]), 0.4).int().tolist()
        [[0, 1, 0], [1, 0, 0]]
    """
    values = entropy[mask].float()
    if gather is not None:
        values = gather(values)
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values, 1 - quantile)
    return (entropy * mask.float() >= threshold) & mask


def mismatch_weights(pairs, mode: str, clip_min: float | None, clip_max: float | None):
    """Importance weights correcting the rollout/training mismatch (docs/algorithm.md §8), detached.

    ``pairs``: ``(logp, rollout_logp, mask)`` [B, T] per kind of action (the tokens, the routing
    actions), ``logp`` the training forward's log-probs of what the rollout emitted, ``rollout_logp``
    the rollout's own. The ratio is ``exp(logp - rollout_logp)``: per step (``token_*``), or one per row
    (``sequence_*``) from the **mean** of the log-ratios over all the row's actions of every kind, the
    joint trajectory's ratio per action. ``*_truncate`` clamps it to ``[clip_min, clip_max]``, ``*_mask``
    sets it to 0 outside. Returns one weight tensor per pair (1 outside its mask; [B, T]) and the
    statistics of the raw ratios (``ratio_mean``, ``ratio_min``, ``ratio_max``, ``corrected``: the
    fraction clamped or masked).

        >>> lp, old, m = (torch.log(torch.tensor([[0.5, 0.2]])), torch.log(torch.tensor([[0.25, 0.4]])),
        ...               torch.ones(1, 2, dtype=torch.bool))
        >>> [[round(x, 4) for x in w[0].tolist()]
        ...  for w in mismatch_weights([(lp, old, m)], "token_truncate", None, 1.5)[0]]
        [[1.5, 0.5]]
        >>> [[round(x, 4) for x in w[0].tolist()]
        ...  for w in mismatch_weights([(lp, old, m)], "sequence_mask", None, 1.5)[0]]
        [[1.0, 1.0]]
    """
    if mode not in IS_CORRECTIONS or mode == "none":
        raise ValueError(f"is_correction={mode!r}: must be one of {IS_CORRECTIONS[1:]}")
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    logs = [torch.where(m, lp.detach() - old, torch.zeros_like(old)) for lp, old, m in pairs]
    if mode.startswith("sequence"):
        count = sum(m.float().sum(-1) for _, _, m in pairs)
        ratio = torch.exp(sum(x.sum(-1) for x in logs) / count.clamp(min=1))  # [B]
        raw = [ratio[:, None].expand_as(x) for x in logs]
        observed = ratio[count > 0]
    else:
        raw = [torch.exp(x) for x in logs]
        observed = torch.cat([r[m] for r, (_, _, m) in zip(raw, pairs)])
    if mode.endswith("truncate"):
        weights = [r.clamp(min=clip_min, max=clip_max) for r in raw]
    else:
        weights = [torch.where((r < low) | (r > high), torch.zeros_like(r), r) for r in raw]
    weights = [torch.where(m, w, torch.ones_like(w)) for w, (_, _, m) in zip(weights, pairs)]
    if observed.numel() == 0:
        observed = torch.ones(1, device=logs[0].device)
    stats = {"ratio_mean": observed.mean(), "ratio_min": observed.min(), "ratio_max": observed.max(),
             "corrected": ((observed < low) | (observed > high)).float().mean()}
    return weights, stats


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
    pi's ratio, the action KL by rho's; ``entropy_coef`` subtracts ``coef`` x the mean entropy over the loss's steps.
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
    if settings.entropy_coef:  # TRL's bonus and logs: loss = policy_loss - coef * entropy (with its gradient)
        steps = mask if b.entropy_mask is None else mask & b.entropy_mask.bool()
        terms["entropy_bonus"] = (scores.entropy * steps).sum() / steps.sum().clamp(min=1)
        terms["policy_loss"], terms["entropy_coef"] = loss, loss.new_tensor(settings.entropy_coef)
        loss = loss - settings.entropy_coef * terms["entropy_bonus"]
    return loss, {k: v.detach() for k, v in terms.items()}


def steps_fed_their_token(settings: LossSettings, mask: torch.Tensor, is_soft: torch.Tensor) -> torch.Tensor:
    """The steps whose sampled token was fed to the model, which carry the token term: the hard ones, or every
    step where the routing feeds a soft step's token too (HRPO's blend: ``token_loss_on_soft``)."""
    return mask if settings.token_loss_on_soft else mask & ~is_soft


def rollout_loss(settings: LossSettings, scores, rollout, advantages: torch.Tensor, num_units: float | None = None,
                 gather=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`tarpo_loss` of a recorded ``rollout`` (a :class:`tarpo.engine.records.Rollout`) under the current
    policy's ``scores``: the one call of the trainer. Builds what the loss reads of the rollout: the steps in the
    loss (:func:`loss_mask`), the rollout's own log-probs of its tokens and routing actions (the ratios' old
    log-probs when ``settings.off_policy``), the mismatch weights (``settings.is_correction``) and the
    high-entropy mask (``settings.top_entropy_quantile``; ``gather``: 1-D values -> every process's).

    Returns the loss and its terms: :func:`tarpo_loss`'s, the importance-sampling statistics
    (``importance_sampling/*``) and the drift of this forward's log-probs of the rollout's tokens from the
    rollout's own (:func:`tarpo.training.metrics.logp_drift`: mean and tails; about 0 on-policy, numerics only; it
    grows as a batch is reused).
    """
    mask = loss_mask(settings, rollout)
    # log rho of the routing action the rollout took, from its recorded p_soft
    rollout_act = torch.where(rollout.is_soft, rollout.p_soft, 1 - rollout.p_soft).clamp(min=1e-12).log()
    batch = LossBatch(advantages=advantages, completion_mask=mask, is_soft=rollout.is_soft, decided=rollout.decided,
                      num_units=num_units)
    if settings.off_policy:
        batch.old_logp_tok, batch.old_logp_act = rollout.logp, rollout_act
    is_stats = {}
    if settings.is_correction != "none":  # the rollout's log-probs against this forward's (docs/algorithm.md §8)
        pairs = [(scores.logp_tok, rollout.logp, steps_fed_their_token(settings, mask, rollout.is_soft)),
                 (scores.logp_act, rollout_act, mask & rollout.decided & settings.use_router)]
        weights, is_stats = mismatch_weights(pairs, settings.is_correction, settings.is_clip_min, settings.is_clip_max)
        batch.is_weights = tuple(weights)
    if settings.top_entropy_quantile < 1.0:  # the same threshold on every process
        batch.entropy_mask = high_entropy_mask(scores.entropy, mask, settings.top_entropy_quantile, gather)
    if settings.off_policy_mask_threshold is not None:  # TRL's off-policy sequence mask (DeepSeek-V3.2), its function
        from trl import GRPOTrainer
        steps = steps_fed_their_token(settings, mask, rollout.is_soft).float()
        batch.rows_kept = GRPOTrainer.get_off_policy_mask(advantages[:, None], scores.logp_tok, rollout.logp, steps,
                                                          settings.off_policy_mask_threshold)
    loss, terms = tarpo_loss(settings, scores, batch)
    terms.update({f"importance_sampling/{k}": v for k, v in is_stats.items()})
    terms.update(logp_drift(scores.logp_tok.detach(), rollout.logp, rollout.completion_mask))  # (.metrics)
    if settings.beta:  # TRL's "kl": the per-step token KL, its mean over the completion steps
        steps = rollout.completion_mask
        terms["kl"] = (scores.kl_tok.detach() * steps).sum() / steps.sum().clamp(min=1)
    return loss, terms
