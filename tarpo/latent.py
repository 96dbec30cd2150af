"""The latent-input baselines of DESIGN §3 that share TARPO's engine: HRPO and Soft Tokens.

Both act at every thinking step (the answer phase stays hard) and both keep the sampled
token ``v_t`` as the step's placeholder, like TARPO's soft steps.

**HRPO** (gated blend, :class:`HrpoGate`)::

    u_t = a ⊙ e + sqrt(1 - a²) ⊙ (i ⊙ m̂)
    a   = exp(-c · softplus(-Λ) ⊙ r),   r = σ(W_r e + b_r),   i = σ(W_i e + b_i),   c = 8

with ``e = E(v_t)`` the sampled token's embedding and ``m̂`` the probability-weighted
embedding of the top-k tokens (the mixture of :mod:`tarpo.mixture`) rescaled to the norm
of ``e`` ("normalised"). Λ is initialised so that ``a_min = exp(-c softplus(-Λ))`` is
uniform in [0.99, 0.999]; as ``r < 1``, ``a > a_min``: training starts from inputs that
are at least 99% token embedding. The token ``v_t`` was fed (blended), so its log-prob
stays in the policy gradient at every step.

**Soft Tokens** (Gaussian reparameterisation, :class:`GaussianSoftTokens`)::

    u_t = p_t^T E + ε_t,   ε_t ~ N(0, σ² I),   σ = 0.33 · rms(E),   p_t = softmax(z_t / T_s)

over the full vocabulary. The rollout records ``u_t``; the policy-gradient term of such a
step is the Gaussian log-likelihood ``log N(u_t; p_θ,t^T E, σ² I)`` of the recorded input
under the current policy's mean (REINFORCE on the noise).
"""

from __future__ import annotations

import math

import torch
from safetensors.torch import load_file, save_file
from torch import nn

HRPO_WEIGHTS = "hrpo_gate.safetensors"


class HrpoGate(nn.Module):
    """HRPO's gate; parameters in fp32 (like the router), applied to soft (thinking) rows."""

    def __init__(self, hidden_size: int, c: float = 8.0, a_range=(0.99, 0.999), seed: int | None = 0):
        super().__init__()
        self.c = float(c)
        self.r = nn.Linear(hidden_size, hidden_size, dtype=torch.float32)
        self.i = nn.Linear(hidden_size, hidden_size, dtype=torch.float32)
        self.lam = nn.Parameter(torch.zeros(hidden_size, dtype=torch.float32))
        self.reset(a_range, seed)

    @torch.no_grad()
    def reset(self, a_range, seed) -> None:
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        a_min = torch.empty(self.lam.shape).uniform_(*a_range, generator=gen)
        # softplus(-Λ) = -ln(a_min)/c  =>  Λ = -log(expm1(-ln(a_min)/c))
        self.lam.copy_(-torch.log(torch.expm1(-torch.log(a_min) / self.c)))

    def blend_weight(self, e: torch.Tensor) -> torch.Tensor:
        """``a`` for token embeddings ``e`` [..., d] (fp32)."""
        r = torch.sigmoid(self.r(e.float()))
        return torch.exp(-self.c * nn.functional.softplus(-self.lam) * r)

    def forward(self, e: torch.Tensor, mixture: torch.Tensor) -> torch.Tensor:
        """The blended input for token embeddings ``e`` and top-k mixtures, both [..., d]."""
        e32, m32 = e.float(), mixture.float()
        m_hat = m32 * (e32.norm(dim=-1, keepdim=True) / m32.norm(dim=-1, keepdim=True).clamp(min=1e-12))
        a = self.blend_weight(e32)
        gate_i = torch.sigmoid(self.i(e32))
        return (a * e32 + torch.sqrt((1 - a * a).clamp(min=0)) * (gate_i * m_hat)).to(e.dtype)

    def save(self, directory: str) -> None:
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()},
                  f"{directory}/{HRPO_WEIGHTS}", metadata={"c": str(self.c)})

    @classmethod
    def load(cls, directory: str, device=None) -> "HrpoGate":
        path = f"{directory}/{HRPO_WEIGHTS}"
        state = load_file(path)
        from safetensors import safe_open
        with safe_open(path, "pt") as f:
            c = float(f.metadata()["c"])
        gate = cls(state["lam"].shape[0], c=c, seed=None)
        gate.load_state_dict(state)
        return gate.to(device) if device is not None else gate


class GaussianSoftTokens:
    """Soft Tokens' noisy full mixture; ``sigma = scale * rms(E)`` fixed at construction."""

    def __init__(self, embedding: torch.Tensor, scale: float = 0.33):
        self.sigma = float(scale * embedding.detach().float().pow(2).mean().sqrt())

    @staticmethod
    def mean(scaled_logits: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """``softmax(z / T_s) @ E`` for already tempered logits [..., V] -> [..., d] (fp32 result;
        the product runs in ``E``'s dtype, so no fp32 copy of ``E`` is made)."""
        return (torch.softmax(scaled_logits.float(), dim=-1).to(embedding.dtype) @ embedding).float()

    def sample(self, scaled_logits, embedding, generator=None) -> torch.Tensor:
        mu = self.mean(scaled_logits, embedding)
        noise = torch.randn(mu.shape, device=mu.device, generator=generator, dtype=torch.float32)
        return mu + self.sigma * noise

    def log_likelihood(self, inputs: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """``log N(inputs; mean, sigma² I)`` per row [..., d] -> [...], constant included."""
        d = inputs.shape[-1]
        sq = (inputs.float() - mean.float()).pow(2).sum(-1)
        return -sq / (2 * self.sigma ** 2) - d * (math.log(self.sigma) + 0.5 * math.log(2 * math.pi))
