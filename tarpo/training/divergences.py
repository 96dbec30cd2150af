"""The KL estimators of the objective (docs/algorithm.md §2, D_KL): the k3 estimate of the token KL per step, the
exact KL over a vocabulary or over the router's two actions, with a gradient that is exactly 0 where the policy
is the reference."""

from __future__ import annotations

import torch


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
