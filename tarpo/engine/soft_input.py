"""The latent-input baselines of docs/algorithm.md §3 that share TARPO's engine: HRPO and Soft Tokens.

Both act at every thinking step (the answer phase stays hard) and both keep the sampled
token ``v_t`` as the step's placeholder, like TARPO's soft steps.

**HRPO** (gated blend, :class:`HrpoGate`)::

    u_t = a ⊙ e + sqrt(1 - a² + 1e-8) ⊙ (i ⊙ m)
    a   = exp(-c · softplus(-Λ) ⊙ r),   r = σ(W_r e + b_r),   i = σ(W_i e + b_i),   c = 8

with ``e = E(v_t)`` the sampled token's embedding. The default mixture is HRPO's own
(``mixture="full"``, HRPO's ``transformers/generation/utils.py`` of its sampling loop)::

    m = (p · E) / ‖p‖₂,   p = softmax(filter(z_t / T_s))

over the full vocabulary, ``p`` being the distribution ``v_t`` was sampled from (the token
policy with its top-k / top-p filters): one [n, V] x [V, d] product per step, the cost of
an lm_head. The rollout records ``m`` (``Rollout.soft_inputs``) and the training forward
recomputes the gate from it, as HRPO's trainer does with its recorded ``thinking_embeds``.
``mixture="top_k"`` is this project's earlier reading: the top-k mixture of
:mod:`tarpo.engine.mixture` rescaled to the norm of ``e``.

Initialisation follows HRPO: ``W_r, W_i ~ N(0, initializer_range)`` with zero biases (the
model's ``_init_weights`` for a ``Linear``), and Λ such that ``a_min = exp(-c softplus(-Λ))``
is uniform in [0.99, 0.999]; as ``r < 1``, ``a > a_min``: training starts from inputs that
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

from ..algorithms import HRPO_MIXTURES
from .precision import full_precision

HRPO_WEIGHTS = "hrpo_gate.safetensors"


HRPO_EPS = 1e-8  # inside the square root, as HRPO's ``thinking_residual``


class HrpoGate(nn.Module):
    """HRPO's gate; parameters in fp32 (like the router), applied to soft (thinking) rows.

    ``mixture`` says which mixture ``m`` the gate blends (module docstring): ``"full"``, HRPO's
    ``(p · E) / ‖p‖₂`` built by :func:`tarpo.engine.mixture.normalised_full_mixture` and used as it is,
    or ``"top_k"``, the top-k mixture rescaled here to ``‖e‖``. It is saved with the weights, so
    evaluation blends the mixture training used.
    """

    def __init__(self, hidden_size: int, c: float = 8.0, a_range=(0.99, 0.999), seed: int | None = 0,
                 init_std: float = 0.02, mixture: str = "full"):
        super().__init__()
        if mixture not in HRPO_MIXTURES:
            raise ValueError(f"HrpoGate mixture={mixture!r}: must be one of {HRPO_MIXTURES}")
        self.c = float(c)
        self.mixture = mixture
        self.r = nn.Linear(hidden_size, hidden_size, dtype=torch.float32)
        self.i = nn.Linear(hidden_size, hidden_size, dtype=torch.float32)
        self.lam = nn.Parameter(torch.zeros(hidden_size, dtype=torch.float32))
        self.reset(a_range, seed, init_std)

    @torch.no_grad()
    def reset(self, a_range, seed, init_std: float = 0.02) -> None:
        """W_r, W_i ~ N(0, init_std), zero biases (the model's ``_init_weights`` for a Linear, with
        ``init_std`` its ``initializer_range``); Λ from a_min ~ U(a_range)."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        for linear in (self.r, self.i):
            linear.weight.copy_(torch.empty(linear.weight.shape).normal_(0.0, init_std, generator=gen))
            linear.bias.zero_()
        a_min = torch.empty(self.lam.shape).uniform_(*a_range, generator=gen)
        # softplus(-Λ) = -ln(a_min)/c  =>  Λ = -log(expm1(-ln(a_min)/c))  (HRPO: -log(a_min^(-1/c) - 1))
        self.lam.copy_(-torch.log(torch.expm1(-torch.log(a_min) / self.c)))

    def blend_weight(self, e: torch.Tensor) -> torch.Tensor:
        """``a`` for token embeddings ``e`` [..., d] (fp32)."""
        with full_precision(e):  # fp32 also under a rollout's or training forward's autocast
            r = torch.sigmoid(self.r(e.float()))
            return torch.exp(-self.c * nn.functional.softplus(-self.lam) * r)

    def forward(self, e: torch.Tensor, mixture: torch.Tensor) -> torch.Tensor:
        """The blended input for token embeddings ``e`` and mixtures ``m``, both [..., d]."""
        e32, m32 = e.float(), mixture.float()
        if self.mixture == "top_k":
            m32 = m32 * (e32.norm(dim=-1, keepdim=True) / m32.norm(dim=-1, keepdim=True).clamp(min=1e-12))
        a = self.blend_weight(e32)
        with full_precision(e32):
            gate_i = torch.sigmoid(self.i(e32))
            return (a * e32 + torch.sqrt(1 - a * a + HRPO_EPS) * (gate_i * m32)).to(e.dtype)

    def save(self, directory: str, state: dict | None = None) -> None:
        """``state``: the tensors to write, when this module's own are shards (tarpo.training.sharding)."""
        save_file({k: v.detach().cpu().contiguous() for k, v in (state or self.state_dict()).items()},
                  f"{directory}/{HRPO_WEIGHTS}", metadata={"c": str(self.c), "mixture": self.mixture})

    @classmethod
    def load(cls, directory: str, device=None) -> "HrpoGate":
        path = f"{directory}/{HRPO_WEIGHTS}"
        state = load_file(path)
        from safetensors import safe_open
        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
        lacking = [key for key in ("c", "mixture") if key not in meta]
        if lacking:  # a gate of an earlier commit: its mixture was not recorded
            raise ValueError(f"{path}: no {' or '.join(lacking)} in its metadata; this version of tarpo reads only "
                             "the gates it writes (train the HRPO run again)")
        gate = cls(state["lam"].shape[0], c=float(meta["c"]), seed=None, mixture=meta["mixture"])
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

    @classmethod
    def input(cls, scaled_logits, embedding, sigma: float, noise: torch.Tensor) -> torch.Tensor:
        """``u_t = mean + sigma * noise`` for pre-drawn standard normals ``noise`` [..., d] (what the
        decode step, :mod:`tarpo.engine.step`, feeds and records)."""
        return cls.mean(scaled_logits, embedding) + sigma * noise

    def log_likelihood(self, inputs: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """``log N(inputs; mean, sigma² I)`` per row [..., d] -> [...], constant included."""
        d = inputs.shape[-1]
        sq = (inputs.float() - mean.float()).pow(2).sum(-1)
        return -sq / (2 * self.sigma ** 2) - d * (math.log(self.sigma) + 0.5 * math.log(2 * math.pi))


class GumbelTopK:
    """Exploration inside the soft mode (SofT-GRPO's Gumbel-softmax; the paper's future work, docs/algorithm.md §8).

    A soft step feeds the top-k mixture of :mod:`tarpo.engine.mixture` with its weights perturbed::

        w = softmax((log alpha + g) / tau_g),   g_i = -log(-log u_i) iid Gumbel(0, 1),   log alpha = z_t / T_s at K_t

    so ``w`` is a draw of the Concrete (Gumbel-softmax) distribution over the k-simplex, whose argmax is
    a draw of softmax(z_t / T_s) restricted to the top k. The rollout records ``w`` (``soft_weights``),
    training rebuilds the same inputs from it, and the policy gradient of such a step is the log-density
    of the draw under the current policy (:meth:`log_density`, REINFORCE on the noise, as Soft Tokens').
    """

    def __init__(self, temperature: float = 0.5):
        self.temperature = float(temperature)

    @staticmethod
    def weights(log_alpha: torch.Tensor, uniforms: torch.Tensor, temperature: float) -> torch.Tensor:
        """The perturbed weights [..., k] fp32 for pre-drawn uniforms in (0, 1).

            >>> GumbelTopK.weights(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.5, 0.5]]), 0.5)
            tensor([[0.5000, 0.5000]])
        """
        return torch.softmax((log_alpha.float() - torch.log(-torch.log(uniforms))) / temperature, dim=-1)

    def log_density(self, log_alpha: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``log Concrete(w; alpha, tau_g)`` [..., k] -> [...] (Maddison et al., 2017)::

            (k-1)! tau^(k-1) prod_i alpha_i w_i^(-tau-1) / (sum_i alpha_i w_i^(-tau))^k

        Unchanged by adding a constant to ``log_alpha``, so the tempered logits serve as they are.
        A weight that underflowed to 0 in fp32 is read as 1e-38.

            >>> g = GumbelTopK(1.0)  # k = 2, tau = 1, alpha = (1, 1): the uniform density 1 on the simplex
            >>> round(float(g.log_density(torch.zeros(2), torch.tensor([0.3, 0.7])).exp()), 4)
            1.0
        """
        k, tau = log_alpha.shape[-1], self.temperature
        log_w = weights.float().clamp(min=1e-38).log()
        return (math.lgamma(k) + (k - 1) * math.log(tau) + (log_alpha.float() - (tau + 1) * log_w).sum(-1)
                - k * torch.logsumexp(log_alpha.float() - tau * log_w, dim=-1))
