"""The TARPO objective of docs/algorithm.md §2 as pure functions of per-step tensors.

Shapes: ``[B, T]`` per trajectory and completion step, ``[B]`` per trajectory. Masks are
bool. Nothing here touches a model: :mod:`tarpo.training.scoring` produces the log-probs.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within consecutive groups of ``group_size``.

    ``std`` is the sample standard deviation (Bessel-corrected, as TRL's GRPO). A group
    whose rewards are all equal gets A = 0, never NaN.

    >>> group_advantages(torch.tensor([1., 0., 0., 0., 1., 1., 1., 1.]), 4)
    tensor([ 1.4997, -0.4999, -0.4999, -0.4999,  0.0000,  0.0000,  0.0000,  0.0000])
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centred)
    return (centred / (std + eps)).view(-1)


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-step k3 estimate of KL(pi || pi_ref): exp(q - p) - (q - p) - 1, q = ref_logp (>= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


class _KL(torch.autograd.Function):
    """sum_j p_j (logp_j - ref_j) over the last axis, p = exp(logp), with the gradient
    p_j (logp_j - ref_j - KL) with respect to ``logp`` (and -p_j to ``ref_logp``).

    Autograd's own gradient is p_j (logp_j - ref_j + 1); the two differ by a multiple of p, which
    the log-softmax that made ``logp`` maps to a multiple of (1 - sum_j p_j): the same gradient
    for the logits. But autograd's reaches them as p - p * sum(p), a rounding error of about
    1e-8 p where the policy equals the reference, and Adam makes a full-size step of such noise;
    this one is exactly 0 wherever logp == ref_logp bitwise (docs/several-gpus.md).
    """

    @staticmethod
    def forward(ctx, logp, ref_logp):
        p = logp.exp()
        diff = logp - ref_logp
        kl = (p * diff).sum(-1)
        ctx.save_for_backward(p, diff, kl)
        return kl

    @staticmethod
    def backward(ctx, grad):
        p, diff, kl = ctx.saved_tensors
        grad = grad.unsqueeze(-1)
        g_logp = grad * p * (diff - kl.unsqueeze(-1)) if ctx.needs_input_grad[0] else None
        g_ref = -grad * p if ctx.needs_input_grad[1] else None
        return g_logp, g_ref


def kl_divergence(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Exact KL(p || ref) over the last axis from normalised log-probs (log-softmax outputs): its
    value is sum p (logp - ref); its gradient, through the log-softmax, is exactly 0 where logp
    equals ref_logp, as at initialisation, when the policy is the reference (:class:`_KL`)."""
    return _KL.apply(logp, ref_logp)


def two_class_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Exact KL(rho || rho_ref) from log-probs [..., 2] over the last axis (:func:`kl_divergence`)."""
    return kl_divergence(logp, ref_logp)


def policy_gradient_term(logp, advantages, old_logp=None, clip_eps=0.2, clip_eps_high=None):
    """Per-step surrogate whose gradient is -A * grad log p.

    On-policy (``old_logp`` None, one gradient step per batch) it is ``-logp * A``, the
    form of docs/algorithm.md §2. With several steps per batch it is PPO's clipped ratio form
    ``-min(r A, clip(r, 1-eps, 1+eps_high) A)``, ``r = exp(logp - old_logp)``.
    """
    adv = advantages[:, None]
    if old_logp is None:
        return -logp * adv
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1 - clip_eps, 1 + (clip_eps if clip_eps_high is None else clip_eps_high))
    return -torch.min(ratio * adv, clipped * adv)


def tarpo_loss(
    *,
    logp_tok: torch.Tensor,
    logp_act: torch.Tensor,
    p_hard: torch.Tensor,
    kl_tok: torch.Tensor,
    kl_act: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    is_soft: torch.Tensor,
    decided: torch.Tensor,
    lambda_act: float,
    beta: float,
    alpha: float,
    use_router: bool = True,
    detach_kl_weight: bool = True,
    old_logp_tok: torch.Tensor | None = None,
    old_logp_act: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    token_loss_on_soft: bool = False,
    logp_latent: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The TARPO loss (docs/algorithm.md §2), averaged over the trajectories of the batch::

        L_tok_i = -(1/T_i) sum_t 1[d_t = hard] log pi(v_t|s_t) A_i
        L_act_i = -(1/T_i) sum_{t in thinking} log rho(d_t|h_t) A_i
        L_KL_i  =  (1/T_i) sum_t [delta_t KL_tok_t + alpha 1[t in thinking] KL_act_t]
        L       =  mean_i [L_tok_i + lambda L_act_i + beta L_KL_i]

    with ``T_i`` the trajectory's units (hard + soft), thinking steps = ``decided`` (steps
    where the router chose the next input), ``delta_t = rho(hard|h_t)`` at thinking steps
    (detached unless ``detach_kl_weight`` is False) and 1 elsewhere. ``mean_i`` over a batch of
    whole groups equals the mean over groups of ``(1/G) sum_i``.

    Without a learned router (``use_router`` False: routing hard / soft / entropy) the
    action terms vanish and delta_t = 1; soft steps still leave L_tok (their token is a
    placeholder that was never fed to the model).

    The latent baselines of docs/algorithm.md §3 generalise which steps carry the policy gradient
    of L_tok: HRPO (``token_loss_on_soft``) feeds v_t blended into every input, so
    1[d_t = hard] becomes 1 at every step; Soft Tokens (``logp_latent``, [B, T]) adds
    ``1[d_t = soft] log N(u_t; mu_theta(s_t), sigma^2 I)``, the log-likelihood of the
    noisy input it fed (on-policy only).

    Args are [B, T] tensors except ``advantages`` [B]; ``logp_act`` is log rho of the
    action taken, ``kl_tok`` the per-step token KL (k3 or full), ``kl_act`` the per-step
    KL(rho || rho_ref). Returns the scalar loss and its per-term means (detached).
    """
    mask = completion_mask.float()
    inv_len = 1.0 / completion_mask.sum(-1).clamp(min=1).float()
    token_steps = (completion_mask if token_loss_on_soft else completion_mask & ~is_soft).float()
    thinking = (completion_mask & decided).float() if use_router else torch.zeros_like(mask)

    pg_tok = policy_gradient_term(logp_tok, advantages, old_logp_tok, clip_eps, clip_eps_high)
    l_tok = (pg_tok * token_steps).sum(-1) * inv_len
    if logp_latent is not None:
        if old_logp_tok is not None:
            raise ValueError("the Soft Tokens term is on-policy only (one gradient step per batch)")
        l_tok = l_tok + (policy_gradient_term(logp_latent, advantages) * (completion_mask & is_soft)).sum(-1) * inv_len
    if use_router:
        pg_act = policy_gradient_term(logp_act, advantages, old_logp_act, clip_eps, clip_eps_high)
        l_act = (pg_act * thinking).sum(-1) * inv_len
        delta = p_hard.detach() if detach_kl_weight else p_hard
        delta = torch.where(thinking.bool(), delta, torch.ones_like(delta))
        kl_act_sum = (kl_act * thinking).sum(-1) * inv_len
    else:
        l_act = torch.zeros_like(l_tok)
        delta = torch.ones_like(mask)
        kl_act_sum = torch.zeros_like(l_tok)
    kl_tok_sum = (delta * kl_tok * mask).sum(-1) * inv_len
    l_kl = kl_tok_sum + alpha * kl_act_sum

    loss = (l_tok + lambda_act * l_act + beta * l_kl).mean()
    terms = {
        "loss_tok": l_tok.mean(), "loss_act": l_act.mean(), "loss_kl": l_kl.mean(),
        "kl_tok": kl_tok_sum.mean(), "kl_act": kl_act_sum.mean(),
    }
    return loss, {k: v.detach() for k, v in terms.items()}
