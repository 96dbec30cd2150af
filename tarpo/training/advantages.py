"""Rewards into advantages, as the trainer computes them (docs/algorithm.md §2, A_i; TRL's ``scale_rewards`` and
``multi_objective_aggregation``): :func:`group_advantages` of one reward per completion, :func:`reward_advantages` of
several reward functions' rewards, weighted."""

from __future__ import annotations

import torch

from ..config import SCALE_REWARDS


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4, scale: str = "group") -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std + eps), the mean over consecutive groups of ``group_size``.

    ``scale`` (TRL's ``scale_rewards``): ``"group"`` divides by the group's standard deviation (the
    paper), ``"batch"`` by the whole batch's, ``"none"`` not at all (Dr. GRPO). ``std`` is the sample
    standard deviation (Bessel-corrected, as TRL's GRPO). A group whose rewards are all equal gets
    A = 0, never NaN.

    >>> group_advantages(torch.tensor([1., 0., 0., 0., 1., 1., 1., 1.]), 4)
    tensor([ 1.4997, -0.4999, -0.4999, -0.4999,  0.0000,  0.0000,  0.0000,  0.0000])
    >>> group_advantages(torch.tensor([1., 0., 0., 0., 1., 1., 1., 1.]), 4, scale="none")
    tensor([ 0.7500, -0.2500, -0.2500, -0.2500,  0.0000,  0.0000,  0.0000,  0.0000])
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards={scale!r}: must be one of {SCALE_REWARDS}")
    from trl.trainer.utils import nanstd

    grouped = rewards.float().view(-1, group_size)
    unscored = torch.isnan(grouped)  # NaN: a row no reward function scored, left out of its group's mean and std
    some = unscored.any(dim=1, keepdim=True)
    centred = grouped - torch.where(some, torch.nanmean(grouped, dim=1, keepdim=True), grouped.mean(1, keepdim=True))
    if scale == "none":
        return torch.where(some & torch.isnan(centred), 0.0, centred).view(-1)
    if scale == "batch":
        flat = rewards.float()
        std = torch.where(unscored.any(), nanstd(flat), flat.std()) if rewards.numel() > 1 else torch.zeros(())
    elif group_size > 1:
        std = torch.where(some, nanstd(grouped, dim=1, keepdim=True), grouped.std(dim=1, keepdim=True))
    else:
        std = torch.zeros_like(centred)
    advantages = centred / (std + eps)
    touched = unscored.any() if scale == "batch" else some  # where an unscored row is: its NaN, or a std of one value
    return torch.where(touched & torch.isnan(advantages), 0.0, advantages).view(-1)


def reward_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, group_size: int, eps: float,
                      scale: str, aggregation: str = "sum_then_normalize") -> tuple[torch.Tensor, torch.Tensor]:
    """``(rewards, advantages)`` of the reward functions' rewards [N, K] (NaN: a function that did not score a row,
    TRL's None) weighted by ``weights`` [K], as TRL's ``multi_objective_aggregation`` combines them. ``rewards``:
    the weighted sum of the functions that scored the row (their NaN as 0), what is logged; NaN for a row that no
    function scored, which, as in TRL, stays out of its group's mean and standard deviation and gets advantage 0
    (TRL's ``_calculate_rewards`` warns of it). ``"sum_then_normalize"`` (the paper): :func:`group_advantages` of
    that sum; ``"normalize_then_sum"`` (GDPO): each function's rewards normalised within its group, ``(r - mean) /
    (std + 1e-4)``, summed with the weights, then normalised over the batch: TRL's formulas, with TRL's ``nanstd``.

    Two groups of two, two functions: the first gives 1, 0 in each group (normalised +-0.7071), the second is constant
    in each (normalised 0); the sums +-0.7071 over their standard deviation 0.8165 give +-0.866:

    >>> r = torch.tensor([[1., 0.], [0., 0.], [1., 10.], [0., 10.]])
    >>> [round(x, 3) for x in reward_advantages(r, torch.ones(2), 2, 1e-4, "group", "normalize_then_sum")[1].tolist()]
    [0.866, -0.866, 0.866, -0.866]
    """
    unscored = torch.isnan(rewards_per_func).all(dim=1)  # every function returned None (TRL's "unscorable" row)
    rewards = (rewards_per_func * weights[None]).nansum(1).masked_fill(unscored, float("nan"))
    if aggregation == "sum_then_normalize":
        return rewards, group_advantages(rewards, group_size, eps, scale)
    from trl.trainer.utils import nanstd

    grouped = rewards_per_func.float().view(-1, group_size, rewards_per_func.shape[1])
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean_k)
    summed = (((grouped - mean_k) / (std_k + 1e-4)).view(-1, grouped.shape[-1]) * weights[None]).nansum(dim=1)
    summed = summed.masked_fill(unscored, float("nan"))
    std = nanstd(summed) if summed.numel() > 1 else torch.zeros_like(summed)
    return rewards, torch.nan_to_num((summed - torch.nanmean(summed)) / (std + 1e-4), nan=0.0)
