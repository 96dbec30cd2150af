"""The loss variants (TRL's ``loss_type``, docs/algorithm.md §8): one table, the one owner of their names.

A variant is a **surrogate**, the per-step loss of a policy-gradient term, and an **aggregation** of per-step
losses into the batch's loss. :func:`tarpo.training.objective.tarpo_loss` applies the surrogate to each of
TARPO's policy terms (the token term with the ratio of pi, the router term with the ratio of rho) and the
aggregation to every term, the KL terms included; :class:`tarpo.config.TarpoConfig` validates ``loss_type``
against :data:`LOSS_TYPES`, the launcher's ``LOSS_TYPE`` lists them. Each variant is TRL 1.15's
``GRPOTrainer._compute_loss`` for hard routing (tests/test_loss_variants.py runs TRL's code).

One signature each:

- ``surrogate(logp, advantages, old_logp, mask, level, settings) -> [B, T]``: ``logp`` the current policy's
  log-probs [B, T], ``advantages`` [B], ``old_logp`` the log-probs the batch was sampled with (None: on-policy,
  one gradient step per batch, the ratio is 1 with the gradient of ``logp``), ``mask`` the term's steps (a
  sequence-level ratio is taken over them), ``level`` TRL's ``importance_sampling_level``, ``settings`` a
  :class:`tarpo.training.objective.LossSettings` (its ``clip_eps``, ``clip_eps_high``, ``delta``, SAPO temperatures
  and VESPO's ``vespo`` = (k_pos, lambda_pos, k_neg, lambda_neg));
- ``aggregate(total, mask, max_completion_length, num_units) -> scalar``: ``total`` the per-step losses, zero
  outside ``mask``; ``num_units`` the units of the whole generation batch per process and optimizer step.

Imports torch only (tensor arithmetic, no model; vespo's weights are TRL's function, imported when used), so the
configuration reads the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def importance_ratio(logp, old_logp, level, mask):
    """``exp(logp - old_logp)`` per step (``level="token"``), or one per row (``"sequence"``, GSPO), the exp of
    the mean of the log-ratios over the row's steps in ``mask``, the same at every step of the row. On-policy
    (``old_logp`` None) ``old_logp`` is ``logp`` detached: the ratio is 1 and carries the gradient of ``logp``."""
    log_ratio = logp - (logp.detach() if old_logp is None else old_logp)
    if level == "sequence":
        m = mask.float()
        log_ratio = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1))[:, None].expand_as(logp)
    return torch.exp(log_ratio)


def upper_clip_eps(settings) -> float:
    """The ratio's upper clip of a :class:`tarpo.training.objective.LossSettings` (TRL's rule): ``epsilon_high``,
    ``epsilon`` where it is unset."""
    return settings.clip_eps if settings.clip_eps_high is None else settings.clip_eps_high


def policy_gradient_term(logp, advantages, old_logp=None, clip_eps=0.2, clip_eps_high=0.2, level="token",
                         mask=None, delta=None):
    """Per-step surrogate whose gradient is -A * grad log p.

    On-policy (``old_logp`` None, one gradient step per batch) and per step (``level="token"``) it is
    ``-logp * A``, the form of docs/algorithm.md §2. With several steps per batch it is PPO's clipped
    ratio form ``-min(r A, clip(r, 1-eps, 1+eps_high) A)`` with ``r`` of :func:`importance_ratio` (per step,
    or with ``level="sequence"`` (GSPO, TRL's ``importance_sampling_level``) one ratio per row). ``delta`` (TRL's
    two-sided clipping): the unclipped branch's ratio is capped at ``delta`` too, ``-min(min(r, delta) A, ...)``.
    """
    adv = advantages[:, None]
    if old_logp is None and level == "token" and (delta is None or delta >= 1):
        return -logp * adv
    ratio = importance_ratio(logp, old_logp, level, mask)
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps_high)
    if delta is not None:
        ratio = ratio.clamp(max=delta)
    return -torch.min(ratio * adv, clipped * adv)


def clipped_surrogate(logp, advantages, old_logp, mask, level, settings):
    """grpo, bnpo, dr_grpo, dapo, luspo: :func:`policy_gradient_term` (PPO's clipped ratio, TRL's two-sided
    ``delta``; on-policy ``-log p A``)."""
    return policy_gradient_term(logp, advantages, old_logp, settings.clip_eps, upper_clip_eps(settings), level, mask,
                                settings.delta)


def vespo_weights(logp, advantages, old_logp, mask, settings):
    """VESPO's ``phi(w) = e^lambda w^k e^(-lambda w)`` of each row's importance ratio ``w`` (the exp of the sum of
    its steps' log-ratios), detached, ``k``/``lambda`` by the advantage's sign (``vespo_k_pos`` ...): TRL's
    ``GRPOTrainer.get_gamma_weights`` itself; ``[B, 1]``."""
    from trl import GRPOTrainer

    log_ratio = (logp - (logp.detach() if old_logp is None else old_logp)).detach()
    return GRPOTrainer.get_gamma_weights(advantages[:, None], log_ratio, mask.float(), None, *settings.vespo)


def vespo_surrogate(logp, advantages, old_logp, mask, level, settings):
    """VESPO (TRL's ``vespo``): ``-phi(w) A log p`` (:func:`vespo_weights`)."""
    return -vespo_weights(logp, advantages, old_logp, mask, settings) * advantages[:, None] * logp


def cispo_surrogate(logp, advantages, old_logp, mask, level, settings):
    """CISPO (MiniMax-M1, arXiv:2506.13585; TRL's ``cispo``): ``-sg(min(r, eps_max)) A log p``, REINFORCE
    weighted by the importance ratio clipped from above at ``eps_max`` and detached, so that no step loses its
    gradient (PPO's clip drops the gradient of a clipped step). ``eps_max`` is TRL's ``epsilon_high`` (the
    ratio's bound itself, not ``1 + eps``; ScaleRL, arXiv:2510.13786, recommends 5), ``epsilon`` if unset."""
    weight = importance_ratio(logp, old_logp, level, mask).clamp(max=upper_clip_eps(settings)).detach()
    return -weight * advantages[:, None] * logp


def sapo_surrogate(logp, advantages, old_logp, mask, level, settings):
    """SAPO (Soft Adaptive Policy Optimization, arXiv:2511.20347; TRL's ``sapo``): ``-f(r) A`` with the smooth
    gate ``f(r) = sigmoid(tau (r - 1)) 4 / tau`` in place of the hard clip, ``tau`` = ``sapo_temperature_pos``
    where ``A > 0``, else ``sapo_temperature_neg``. ``f'(1) = 1``: on-policy the gradient is ``-A grad log p``;
    away from ``r = 1`` the gradient fades smoothly (``f'(r) = 4 s (1 - s)``, ``s = sigmoid(tau (r - 1))``)."""
    adv = advantages[:, None]
    ratio = importance_ratio(logp, old_logp, level, mask)
    tau = torch.where(adv > 0, settings.sapo_temperature_pos, settings.sapo_temperature_neg)
    return -(torch.sigmoid(tau * (ratio - 1)) * 4 / tau) * adv


def per_trajectory(total, mask, max_completion_length, num_units):
    """Mean over rows of ``(1/T_i) sum_t`` (T_i = the row's units, hard + soft): the paper's Eq. 5."""
    return (total.sum(-1) / mask.sum(-1).clamp(min=1).float()).mean()


def per_trajectory_sum(total, mask, max_completion_length, num_units):
    """Mean over rows of ``sum_t`` (LUSPO: a row's loss is not divided by its length)."""
    return total.sum(-1).mean()


def per_batch_unit(total, mask, max_completion_length, num_units):
    """``sum / (units in this batch)``."""
    return total.sum() / mask.sum().clamp(min=1).float()


def per_completion_budget(total, mask, max_completion_length, num_units):
    """``sum / (rows * max_completion_length)`` (Dr. GRPO)."""
    return total.sum() / (total.shape[0] * max_completion_length)


def per_generation_unit(total, mask, max_completion_length, num_units):
    """``sum / num_units``, the units of the whole generation batch on every process, divided by the processes
    and the optimizer steps it spans (the trainer passes it)."""
    return total.sum() / max(float(num_units), 1.0)


@dataclass(frozen=True)
class LossType:
    name: str                  # TarpoConfig.loss_type, the launchers' LOSS_TYPE
    surrogate: Callable        # (logp, advantages, old_logp, mask, level, settings) -> [B, T]
    aggregate: Callable        # (total, mask, max_completion_length, num_units) -> scalar
    help: str                  # TarpoConfig.loss_type's help


LOSSES = {t.name: t for t in (
    LossType("grpo", clipped_surrogate, per_trajectory, "the paper: mean over trajectories of (1/T_i) sum_t"),
    LossType("dapo", clipped_surrogate, per_generation_unit, "sum over the generation batch's units"),
    LossType("dr_grpo", clipped_surrogate, per_completion_budget, "sum / (rows x max_completion_length)"),
    LossType("bnpo", clipped_surrogate, per_batch_unit, "sum over this batch's units"),
    LossType("cispo", cispo_surrogate, per_generation_unit, "-sg(min(r, epsilon_high)) A log p (MiniMax-M1), "
                                                            "aggregated as dapo"),
    LossType("sapo", sapo_surrogate, per_trajectory, "-sigmoid(tau (r - 1)) 4/tau A (SAPO; tau: "
                                                     "sapo_temperature_pos/neg), aggregated as grpo"),
    LossType("luspo", clipped_surrogate, per_trajectory_sum, "as grpo, a row's loss summed over its steps, not "
                                                             "averaged (LUSPO)"),
    LossType("vespo", vespo_surrogate, per_generation_unit, "-phi(w) A log p, phi a gamma weight of the row's "
                                                            "ratio (VESPO; vespo_k/lambda_pos/neg), as dapo"),
)}
LOSS_TYPES = tuple(LOSSES)


def loss_variant(name: str) -> LossType:
    """The table's entry ``name``; an unknown name raises ``ValueError`` naming ``loss_type``.

    >>> loss_variant("dapo").aggregate is loss_variant("cispo").aggregate
    True
    >>> x, m = torch.tensor([[1., 1., 0.], [3., 0., 0.]]), torch.tensor([[True, True, False], [True, False, False]])
    >>> [round(float(loss_variant(t).aggregate(x, m, 3, 3.0)), 4) for t in ("grpo", "bnpo", "dr_grpo", "dapo")]
    [2.0, 1.6667, 0.8333, 1.6667]
    """
    if name not in LOSSES:
        raise ValueError(f"loss_type={name!r}: must be one of {', '.join(LOSS_TYPES)}")
    return LOSSES[name]
