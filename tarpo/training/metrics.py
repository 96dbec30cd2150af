"""What a rollout logs (docs/design-notes.md, "Logged metrics"): the project's metrics, and TRL's names for the same
quantities as TRL's ``GRPOTrainer`` computes them, so that scripts and dashboards written for TRL read them.

TRL's names here: ``reward``, ``reward_std``, ``frac_reward_zero_std``, ``rewards/<func>/mean`` and ``/std``,
``completions/mean_length`` / ``min_length`` / ``max_length`` (a completion's generated steps: hard and soft),
``completions/mean_terminated_length`` / ``min_`` / ``max_`` (those that ended with an end token),
``completions/clipped_ratio``, ``entropy``, ``num_tokens``; the loss step adds ``kl``, ``clip_ratio/*`` and
``vespo/phi_seq_mean`` (:func:`tarpo.training.loss_inputs.rollout_loss`). With ``log_completions`` the rollout's
prompts, completions, rewards and advantages go to TRL's completion log (its printed sample, parquet files,
wandb/trackio tables). The figures are computed here from the rollout alone; ``TrainerLogs._report``
(:mod:`tarpo.training.trainer_logs`) writes them into TRL's logs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from accelerate.utils import gather_object
from trl.trainer.utils import nanmax, nanmin, nanstd


@dataclass(frozen=True)
class ReportSettings:
    """What a rollout's figures are computed with besides the rollout, built once per trainer: the processes' gather,
    the group size, the reward functions (their names; a grader's ``timeouts`` count), whether the routing has a
    router, and the process's device. Fixed once the trainer is built (TRL sets none of them again)."""
    gather: Callable
    group_size: int
    reward_funcs: tuple
    reward_names: tuple
    router: bool
    device: torch.device


def rollout_figures(s: ReportSettings, rollout, rewards, rewards_per_func, n_trunc: int) -> tuple[dict, int]:
    """A rollout's metrics (every process's rows gathered) by name, and the tokens it read and wrote (its prompts
    and completions: TRL's ``num_input_tokens_seen``)."""
    gather, metrics = s.gather, {}
    mask = rollout.completion_mask
    units = gather(rollout.units.float())
    hard = gather(rollout.hard_tokens.float())
    soft = gather(rollout.is_soft.sum().float()[None]).sum()
    decided = gather(rollout.decided.sum().float()[None]).sum()
    p_soft = gather(rollout.p_soft[rollout.decided].sum()[None]).sum()
    entropy = gather(rollout.entropy[mask].sum()[None]).sum()
    ended = gather(rollout.ended_with_eos)
    grouped = rewards.view(-1, s.group_size)
    metrics["reward"] = torch.nanmean(rewards).item()  # rows no reward function scored left out (TRL's)
    metrics["reward_std"] = nanstd(rewards).item()
    alike = torch.isclose(nanstd(grouped, dim=1), torch.zeros(()))  # TRL's: the group's scored rows' std is 0
    metrics["frac_reward_zero_std"] = alike.float().mean().item()
    for i, name in enumerate(s.reward_names):
        metrics[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
        metrics[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
        if hasattr(s.reward_funcs[i], "timeouts"):  # answers that hit the grader's timeout (scored 0)
            timeouts = torch.tensor([float(s.reward_funcs[i].timeouts)], device=rewards.device)
            metrics[f"rewards/{name}/timeouts"] = gather(timeouts).sum().item()
    metrics["entropy"] = (entropy / units.sum().clamp(min=1)).item()
    metrics["completions/mean_units"] = units.mean().item()
    metrics["completions/mean_hard_tokens"] = hard.mean().item()
    terminated = units[ended] if ended.any() else torch.zeros(1, device=units.device)  # TRL's edge case: none
    for name, values in (("length", units), ("terminated_length", terminated)):
        metrics[f"completions/mean_{name}"] = values.mean().item()
        metrics[f"completions/min_{name}"] = values.min().item()
        metrics[f"completions/max_{name}"] = values.max().item()
    metrics["completions/clipped_ratio"] = 1 - ended.float().mean().item()
    metrics["soft_ratio"] = (soft / units.sum().clamp(min=1)).item()
    metrics["router/p_soft"] = (p_soft / decided.clamp(min=1)).item() if s.router else 0.0
    metrics["prompts/truncated"] = float(n_trunc)
    return metrics, int(gather(rollout.prompt_mask.sum()[None]).sum() + units.sum())


def completion_rows(s: ReportSettings, prompts, completions, rewards_per_func, advantages) -> dict:
    """``log_completions``: the rollout's rows for TRL's completion log (every process's; advantages: the whole
    batch's), in its layout (``prompt``, ``completion``, ``rewards[name]``, ``advantages``)."""
    return {"prompt": gather_object(prompts), "completion": gather_object(completions),
            "rewards": {name: rewards_per_func[:, i].tolist() for i, name in enumerate(s.reward_names)},
            "advantages": advantages.tolist()}


def reward_logs(s: ReportSettings, extra: dict, pending: dict, rows: int) -> tuple[dict, dict]:
    """What the reward functions logged during this rollout through TRL's ``log_extra`` (``extra``: column ->
    this process's values) and ``log_metric`` (``pending``: name -> values), as TRL's own flush of its
    ``_generate_and_score_completions`` (which this trainer replaces) reports them: each extra column gathered over
    the processes (for the completion log), each metric's mean over the processes. ``rows``: this process's
    completions (a column a process did not log is None there)."""
    columns = {column: gather_object(extra.get(column, [None] * rows))
               for column in sorted(set(gather_object(list(extra))))}  # sorted: every rank gathers in the same order
    means = {}
    for name in sorted(set(gather_object(list(pending)))):
        values = pending.get(name, [])
        stats = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=s.device)
        total, count = s.gather(stats).view(-1, 2).sum(dim=0).tolist()
        means[name] = total / count
    return columns, means


def nan_quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """``torch.nanquantile(values, q)`` of a 1-D tensor (linear interpolation), of any size (torch's refuses more
    than 2**24 values: a long evaluation's drifts) and without a host read (the NaNs sort last).

        >>> v = torch.tensor([0.5, float("nan"), 0.1, 0.3])
        >>> round(nan_quantile(v, 0.5).item(), 4), round(torch.nanquantile(v, 0.5).item(), 4)
        (0.3, 0.3)
    """
    if values.numel() == 0:
        return values.new_full((), float("nan"))
    ordered = torch.sort(values).values
    count = (~torch.isnan(values)).sum()
    at = q * (count - 1).clamp(min=0).to(ordered.dtype)
    low, high = at.floor().long().view(1), at.ceil().long().view(1)
    below, above = ordered.index_select(0, low)[0], ordered.index_select(0, high)[0]  # indexing by a tensor: no read
    value = below + (above - below) * (at - low[0].to(ordered.dtype))
    return torch.where(count > 0, value, torch.full_like(value, float("nan")))


class LossFigures:
    """The loss step's figures (:func:`tarpo.training.loss_inputs.rollout_loss`'s terms: the objective's, the
    importance-sampling statistics, the drift, ``kl``; :func:`loss_type_metrics`'s clip ratios), kept on the device
    and read once a step. Each micro-batch's figures are gathered over the processes in one collective and reduced
    there (the minimum for ``*_min``, the maximum for ``*_max``, else the mean); :meth:`flush` reads every pending
    micro-batch's at once, one host read, into TRL's ``_metrics`` (one value a micro-batch, as TRL logs): at the
    optimizer step in training, at the log in an evaluation. ``logp_drift_p99`` is one value a step: the 99th
    percentile of the drift over all the step's completion steps on each process (with several processes, the
    largest of theirs), where a mean of per-micro-batch percentiles would be no percentile of anything."""

    def __init__(self, gather):
        self.gather = gather  # a tensor [n] -> every process's, [processes * n] (accelerate's gather)
        self.pending = {"train": [], "eval": []}  # (names, reduced values [n]) a micro-batch
        self.drifts = {"train": [], "eval": []}   # a micro-batch's |delta log p| [B * T], NaN off its steps

    def add(self, mode: str, terms: dict, drift: torch.Tensor) -> None:
        """A micro-batch's ``terms`` (0-dim tensors) and its drift (:func:`drift_steps`): no host read."""
        names = tuple(terms)
        every = self.gather(torch.stack([terms[n].detach().float().reshape(()) for n in names])[None])
        every = every.reshape(-1, len(names))
        reduced = torch.stack([every[:, i].min() if n.endswith("_min") else every[:, i].max() if n.endswith("_max")
                               else every[:, i].mean() for i, n in enumerate(names)])
        self.pending[mode].append((names, reduced))
        self.drifts[mode].append(drift.detach().float().flatten())

    def discard(self, mode: str) -> None:
        """Drop ``mode``'s pending figures (an evaluation's that ``predict`` left: it never logs)."""
        self.pending[mode].clear()
        self.drifts[mode].clear()

    def flush(self, mode: str, metrics) -> None:
        """Every pending figure of ``mode`` into ``metrics`` (TRL's ``_metrics[mode]``): the one host read."""
        entries, drifts = self.pending[mode], self.drifts[mode]
        if not entries:
            return
        p99 = self.gather(nan_quantile(torch.cat(drifts), 0.99)[None]).max()
        values = torch.cat([v for _, v in entries] + [p99[None]]).tolist()
        at = 0
        for names, _ in entries:
            for name in names:
                metrics[name].append(values[at])
                at += 1
        metrics["logp_drift_p99"].append(values[at])
        entries.clear()
        drifts.clear()


DRIFT_OVER = 0.1  # |delta log p| counted by ``logp_drift_frac_over_0.1``


def logp_drift(logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far this forward's log-probs of the rollout's tokens (``logp`` [B, T]) are from the rollout's own
    (``rollout_logp``), over the completion steps (``mask``): ``logp_drift`` the mean |delta|, ``logp_drift_p99``
    its 99th percentile, ``logp_drift_max`` its maximum and ``logp_drift_frac_over_0.1`` the fraction of steps over
    :data:`DRIFT_OVER`. On-policy the drift is numerics only (bf16 rounding, kernels that differ between the decode
    step and the training forward); a tail far above the mean is where a mismatch correction acts. Computed on the
    device without a host synchronisation (NaN marks the steps outside ``mask`` for the percentile).

    >>> logp = torch.tensor([[-1.0, -2.0, -3.0]])
    >>> d = logp_drift(logp, logp + torch.tensor([[0.0, 0.2, 9.0]]), torch.tensor([[True, True, False]]))
    >>> {k: round(v.item(), 4) for k, v in d.items()}
    {'logp_drift': 0.1, 'logp_drift_p99': 0.198, 'logp_drift_max': 0.2, 'logp_drift_frac_over_0.1': 0.5}
    """
    diff = drift_steps(logp, rollout_logp, mask)
    count = mask.sum().clamp(min=1)
    inside = diff.nan_to_num(0.0)
    return {"logp_drift": inside.sum() / count, "logp_drift_p99": nan_quantile(diff.flatten(), 0.99),
            "logp_drift_max": inside.max(), f"logp_drift_frac_over_{DRIFT_OVER:g}": (diff > DRIFT_OVER).sum() / count}


def drift_steps(logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``|logp - rollout_logp|`` at the steps of ``mask``, NaN elsewhere ([B, T]): the drift :func:`logp_drift`
    summarises and :class:`LossFigures` takes a step's percentile of."""
    return torch.where(mask, (logp - rollout_logp).abs(), float("nan"))


CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # the loss types TRL logs clip ratios for


def loss_type_metrics(settings, logp: torch.Tensor, rollout, advantages: torch.Tensor) -> dict[str, torch.Tensor]:
    """What TRL logs of its loss type's ratio. The clipped types: ``clip_ratio/low_mean``, ``high_mean`` and
    ``region_mean`` of the token term (the share of its steps whose ratio the clip holds: below ``1 - epsilon`` with
    ``A < 0``, above ``1 + epsilon_high`` with ``A > 0``; on-policy the ratio is 1 and they are 0), and
    ``clip_ratio/low_min`` and ``high_max``, the smallest and largest of the rows' shares. ``cispo``:
    ``cispo_clip_ratio``, the share of steps with ``A > 0`` whose weight ``epsilon_high`` caps. ``vespo``:
    ``vespo/phi_seq_mean``, the mean over rows of its weight (1 on-policy)."""
    from ..losses import importance_ratio, upper_clip_eps, vespo_weights
    mask = rollout.completion_mask
    old = rollout.logp if settings.off_policy else None
    if settings.loss_type == "vespo":
        return {"vespo/phi_seq_mean": vespo_weights(logp.detach(), advantages, old, mask, settings).mean()}
    if settings.loss_type not in CLIPPED + ("cispo",):
        return {}
    ratio = importance_ratio(logp.detach(), old, settings.level, mask)
    adv = advantages[:, None]
    count = mask.sum().clamp(min=1)
    if settings.loss_type == "cispo":  # the share of steps whose weight min(r, epsilon_high) caps
        return {"cispo_clip_ratio": ((ratio > upper_clip_eps(settings)) & (adv > 0) & mask).sum() / count}
    low_clipped = (ratio < 1 - settings.clip_eps) & (adv < 0) & mask
    high_clipped = (ratio > 1 + upper_clip_eps(settings)) & (adv > 0) & mask

    def rows(clipped):  # each row's share of its steps (NaN for a row without any), as TRL's masked_seq_mean
        return clipped.sum(-1) / mask.sum(-1)
    low_rows, high_rows = rows(low_clipped), rows(high_clipped)
    return {"clip_ratio/low_mean": low_clipped.sum() / count, "clip_ratio/high_mean": high_clipped.sum() / count,
            "clip_ratio/region_mean": (low_clipped | high_clipped).sum() / count,
            "clip_ratio/low_min": nanmin(low_rows), "clip_ratio/high_max": nanmax(high_rows)}
