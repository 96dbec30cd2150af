"""What the TARPO loss reads of a recorded rollout, and the trainer's one call of it (:func:`rollout_loss`): the steps
in the loss (:func:`loss_mask`, :func:`steps_fed_their_token`), the mismatch weights (:func:`mismatch_weights`,
docs/algorithm.md §8), the high-entropy mask (:func:`high_entropy_mask`), TRL's off-policy sequence mask, and the
figures logged beside the loss (the drift, ``kl``). The loss itself is :mod:`tarpo.training.objective`.
"""

from __future__ import annotations

import math

import torch

from ..method_fields import IS_CORRECTIONS
from . import objective
from .metrics import logp_drift
from .objective import LossBatch, LossSettings, steps_fed_their_token


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


def rollout_loss(settings: LossSettings, scores, rollout, advantages: torch.Tensor, num_units: float | None = None,
                 gather=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`tarpo.training.objective.tarpo_loss` of a recorded ``rollout`` (a :class:`tarpo.engine.records.Rollout`)
    under the current policy's ``scores``: the one call of the trainer. Builds what the loss reads of the rollout:
    the steps in the loss (:func:`loss_mask`), the rollout's own log-probs of its tokens and routing actions (the
    ratios' old log-probs when ``settings.off_policy``), the mismatch weights (``settings.is_correction``) and the
    high-entropy mask (``settings.top_entropy_quantile``; ``gather``: 1-D values -> every process's).

    Returns the loss and its terms: ``tarpo_loss``'s, the importance-sampling statistics
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
    loss, terms = objective.tarpo_loss(settings, scores, batch)
    terms.update({f"importance_sampling/{k}": v for k, v in is_stats.items()})
    terms.update(logp_drift(scores.logp_tok.detach(), rollout.logp, rollout.completion_mask))  # (.metrics)
    if settings.beta:  # TRL's "kl": the per-step token KL, its mean over the completion steps
        steps = rollout.completion_mask
        terms["kl"] = (scores.kl_tok.detach() * steps).sum() / steps.sum().clamp(min=1)
    return loss, terms
