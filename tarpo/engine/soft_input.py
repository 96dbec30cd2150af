"""What a soft step feeds: one class per entry of :data:`tarpo.algorithms.SOFT_INPUTS` (docs/algorithm.md §1, §3).

Each class says how a step's input is drawn (:meth:`TopKMixture.draw`, run by the decode step of both
rollout engines), what the rollout records of it, how the training forward rebuilds the input from that
record (:meth:`~TopKMixture.recorded_mixture`, :meth:`~TopKMixture.feed`) and, where the input is a random
draw, its log-density under the current policy (:meth:`~TopKMixture.draw_log_density`). The routing table
names one (``Routing.soft_input``); the trainer builds it once per run (:meth:`~SoftInputBase.for_run`), trains its
parameters in its own optimizer groups (:meth:`~SoftInputBase.parameter_groups`), saves it beside the adapter
(:meth:`~SoftInputBase.save`) and the evaluation loads it from there (:meth:`~SoftInputBase.load`); the memory plan
counts its parameters before any model exists (:meth:`~SoftInputBase.trained_elements`). Every soft input keeps the
sampled token ``v_t`` as the step's placeholder.

**TARPO's top-k mixture** (:class:`TopKMixture`)::

    u_t = sum_i w_t[i] * E(K_t[i]),   K_t = top-k(z_t / T_s),   w_t = softmax(z_t / T_s)[K_t] renormalised

The latent-input baselines of docs/algorithm.md §3, HRPO and Soft Tokens, act at every thinking
step (the answer phase stays hard).

**HRPO** (gated blend, :class:`tarpo.engine.hrpo_gate.HrpoGate`, its module docstring).

**Soft Tokens** (Gaussian reparameterisation, :class:`GaussianSoftTokens`)::

    u_t = p_t^T E + ε_t,   ε_t ~ N(0, σ² I),   σ = 0.33 · rms(E),   p_t = softmax(z_t / T_s)

over the full vocabulary. The rollout records ``u_t``; the policy-gradient term of such a
step is the Gaussian log-likelihood ``log N(u_t; p_θ,t^T E, σ² I)`` of the recorded input
under the current policy's mean (REINFORCE on the noise).

**TARPO w/ Gumbel** (:class:`GumbelTopK`, docs/algorithm.md §8): the top-k mixture with Gumbel-softmax weights.

What every soft input does unless its class says otherwise is :class:`tarpo.engine.soft_input_base.SoftInputBase`.
Adding a variant is one class here (``@with_kind``: its row of :data:`tarpo.algorithms.SOFT_INPUTS`), its entry in
:data:`CLASSES` and that row; a routing rule that feeds it is a row of ``ROUTINGS`` (the smallest
example: docs/algorithm.md §3).
"""

from __future__ import annotations

import math

import torch

from ..algorithms import GAUSSIAN, GUMBEL, SOFT_INPUTS, TOP_K
from .hrpo_gate import HRPO_WEIGHTS, HrpoGate  # noqa: F401  (in CLASSES; importers of soft inputs find it here)
from .mixture import soft_topk, topk_mixture
from .sampling import STREAM_GAUSSIAN, STREAM_GUMBEL
from .soft_input_base import SoftInputBase, recorded_topk, topk_records, with_kind


def soft_input_class(name: str) -> type:
    """The class of the soft input called ``name`` (``Routing.soft_input``)."""
    return CLASSES[name]


@with_kind
class TopKMixture(SoftInputBase):
    """TARPO's soft input (module docstring): the top-k mixture, rebuilt in training from the recorded ids and
    fp32 weights (k ids and k floats a soft step)."""

    name = TOP_K

    def draw(self, embedding, scaled, filtered, k, noise):
        return topk_records(embedding, scaled, k)

    def recorded_mixture(self, embedding, recorded, chunk_size):
        return recorded_topk(embedding, recorded, chunk_size)


TOP_K_MIXTURE = TopKMixture()  # stateless: the one every top-k routing shares


@with_kind
class GaussianSoftTokens(SoftInputBase):
    """Soft Tokens' noisy full mixture; ``sigma = scale * rms(E)`` fixed at construction."""

    name = GAUSSIAN
    density_reads = ("soft_inputs",)
    settings_file = "soft_tokens.json"

    def __init__(self, sigma: float):
        self.sigma = float(sigma)

    @classmethod
    def of_embedding(cls, embedding: torch.Tensor, scale: float = 0.33) -> "GaussianSoftTokens":
        """``sigma = scale * rms(E)``."""
        return cls(float(scale * embedding.detach().float().pow(2).mean().sqrt()))

    @classmethod
    def for_run(cls, args, model) -> "GaussianSoftTokens":
        return cls.of_embedding(model.get_input_embeddings().weight, args.soft_tokens_noise_scale)

    @classmethod
    def full_mixture(cls, args) -> bool:
        return True

    @property
    def records_mixture(self) -> bool:
        return True

    def settings(self) -> dict:
        return {"sigma": self.sigma}

    @staticmethod
    def mean(scaled_logits: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """``softmax(z / T_s) @ E`` for already tempered logits [..., V] -> [..., d] (fp32 result;
        the product runs in ``E``'s dtype, so no fp32 copy of ``E`` is made)."""
        return (torch.softmax(scaled_logits.float(), dim=-1).to(embedding.dtype) @ embedding).float()

    @classmethod
    def input(cls, scaled_logits, embedding, sigma: float, noise: torch.Tensor) -> torch.Tensor:
        """``u_t = mean + sigma * noise`` for pre-drawn standard normals ``noise`` [..., d]."""
        return cls.mean(scaled_logits, embedding) + sigma * noise

    def draw(self, embedding, scaled, filtered, k, noise):
        mixed = self.input(scaled, embedding, self.sigma, noise(STREAM_GAUSSIAN, embedding.shape[1], normal=True))
        return mixed, dict(soft_inputs=mixed)

    def recorded_mixture(self, embedding, recorded, chunk_size):
        return recorded["soft_inputs"].float()

    def log_likelihood(self, inputs: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """``log N(inputs; mean, sigma² I)`` per row [..., d] -> [...], constant included."""
        d = inputs.shape[-1]
        sq = (inputs.float() - mean.float()).pow(2).sum(-1)
        return -sq / (2 * self.sigma ** 2) - d * (math.log(self.sigma) + 0.5 * math.log(2 * math.pi))

    def draw_log_density(self, logits, embedding, recorded, temperature):
        """``log N(u_t; softmax(z_t / T_s) @ E, sigma² I)`` of the recorded inputs."""
        return self.log_likelihood(recorded["soft_inputs"], self.mean(logits / temperature, embedding))


@with_kind
class GumbelTopK(TopKMixture):
    """Exploration inside the soft mode (SofT-GRPO's Gumbel-softmax; the paper's future work, docs/algorithm.md §8).

    A soft step feeds the top-k mixture of :mod:`tarpo.engine.mixture` with its weights perturbed::

        w = softmax((log alpha + g) / tau_g),   g_i = -log(-log u_i) iid Gumbel(0, 1),   log alpha = z_t / T_s at K_t

    so ``w`` is a draw of the Concrete (Gumbel-softmax) distribution over the k-simplex, whose argmax is
    a draw of softmax(z_t / T_s) restricted to the top k. The rollout records ``w`` (``soft_weights``),
    training rebuilds the same inputs from it, and the policy gradient of such a step is the log-density
    of the draw under the current policy (:meth:`log_density`, REINFORCE on the noise, as Soft Tokens').
    """

    name = GUMBEL
    density_reads = ("soft_ids", "soft_weights")
    settings_file = "gumbel_top_k.json"

    def __init__(self, temperature: float = 0.5):
        self.temperature = float(temperature)

    def settings(self) -> dict:
        return {"temperature": self.temperature}

    @classmethod
    def for_run(cls, args, model) -> "GumbelTopK":
        return cls(args.gumbel_temperature)

    @staticmethod
    def weights(log_alpha: torch.Tensor, uniforms: torch.Tensor, temperature: float) -> torch.Tensor:
        """The perturbed weights [..., k] fp32 for pre-drawn uniforms in (0, 1).

            >>> GumbelTopK.weights(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.5, 0.5]]), 0.5)
            tensor([[0.5000, 0.5000]])
        """
        return torch.softmax((log_alpha.float() - torch.log(-torch.log(uniforms))) / temperature, dim=-1)

    def draw(self, embedding, scaled, filtered, k, noise):
        ids, _ = soft_topk(scaled, k)
        weights = self.weights(scaled.gather(-1, ids), noise(STREAM_GUMBEL, k), self.temperature)
        return topk_mixture(embedding, ids, weights), dict(soft_ids=ids, soft_weights=weights)

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

    def draw_log_density(self, logits, embedding, recorded, temperature):
        """``log Concrete(w_t; alpha = exp(z_t / T_s) at the recorded top-k ids)`` of the recorded weights."""
        return self.log_density(logits.gather(-1, recorded["soft_ids"]) / temperature, recorded["soft_weights"])


# The registry, complete by construction: one class per row of SOFT_INPUTS, the module refuses to import otherwise.
CLASSES: dict[str, type] = {cls.name: cls for cls in (TopKMixture, GumbelTopK, GaussianSoftTokens, HrpoGate)}
if set(CLASSES) != set(SOFT_INPUTS):
    raise ImportError(f"tarpo.engine.soft_input: classes for {sorted(CLASSES)}, SOFT_INPUTS has {sorted(SOFT_INPUTS)}")
