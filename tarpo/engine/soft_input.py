"""What a soft step feeds: one class per entry of :data:`tarpo.algorithms.SOFT_INPUTS` (docs/algorithm.md §1, §3).

Each class says how a step's input is drawn (:meth:`TopKMixture.draw`, run by the decode step of both
rollout engines), what the rollout records of it, how the training forward rebuilds the input from that
record (:meth:`~TopKMixture.recorded_mixture`, :meth:`~TopKMixture.feed`) and, where the input is a random
draw, its log-density under the current policy (:meth:`~TopKMixture.draw_log_density`). The routing table
names one (``Routing.soft_input``); the trainer builds it once per run (:meth:`~TopKMixture.for_run`) and the
evaluation loads it beside the adapter (:meth:`~TopKMixture.load`). Every soft input keeps the sampled token
``v_t`` as the step's placeholder.

**TARPO's top-k mixture** (:class:`TopKMixture`)::

    u_t = sum_i w_t[i] * E(K_t[i]),   K_t = top-k(z_t / T_s),   w_t = softmax(z_t / T_s)[K_t] renormalised

The latent-input baselines of docs/algorithm.md §3, HRPO and Soft Tokens, act at every thinking
step (the answer phase stays hard).

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

**TARPO w/ Gumbel** (:class:`GumbelTopK`, docs/algorithm.md §8): the top-k mixture with Gumbel-softmax weights.

Adding a variant is one class here, registered under its name (``@registered``), and its row of
:data:`tarpo.algorithms.SOFT_INPUTS`; a routing rule that feeds it is a row of ``ROUTINGS`` (the smallest
example: docs/algorithm.md §3).
"""

from __future__ import annotations

import math

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..algorithms import GAUSSIAN, GUMBEL, HRPO_GATE, HRPO_MIXTURES, SOFT_INPUTS, TOP_K
from .mixture import normalised_full_mixture, soft_topk, topk_mixture
from .precision import full_precision
from .sampling import STREAM_GAUSSIAN, STREAM_GUMBEL

HRPO_WEIGHTS = "hrpo_gate.safetensors"
HRPO_EPS = 1e-8  # inside the square root, as HRPO's ``thinking_residual``

CLASSES: dict[str, type] = {}  # SOFT_INPUTS' name -> its class


def registered(cls):
    """Register ``cls`` as the code of the soft input ``cls.name`` (a row of :data:`tarpo.algorithms.SOFT_INPUTS`,
    which ``cls.kind`` then is)."""
    cls.kind = SOFT_INPUTS[cls.name]
    CLASSES[cls.name] = cls
    return cls


def soft_input_class(name: str) -> type:
    """The class of the soft input called ``name`` (``Routing.soft_input``)."""
    return CLASSES[name]


class SoftInputBase:
    """What every soft input does unless its class says otherwise. ``draw`` and ``recorded_mixture`` are the
    two each class writes; the rest default to a mixture fed as it is, with no parameters and no log-density."""

    name = ""
    kind = None           # its row of tarpo.algorithms.SOFT_INPUTS (set by @registered)
    weights_file = None   # the file its trained parameters are saved in beside the adapter (kind.trained)
    density_reads = ()    # the records draw_log_density reads (kind.log_density)

    @classmethod
    def for_run(cls, args, model) -> "SoftInputBase":
        """This soft input as a run's :class:`tarpo.config.TarpoConfig` ``args`` sets it up for ``model``."""
        return cls()

    @classmethod
    def full_mixture(cls, setting) -> bool:
        """Does a soft step feed, and the rollout record (``Rollout.soft_inputs``), a ``d``-wide full-vocabulary
        mixture under the run's settings (``setting(name)`` reads one)? The decode step and the memory plan ask."""
        return False

    @property
    def records_mixture(self) -> bool:
        return self.full_mixture(self.setting)

    def setting(self, name):
        """This instance's value of the run setting ``name`` (what :meth:`full_mixture` reads)."""
        raise KeyError(name)

    def draw(self, embedding, scaled, filtered, k: int, noise) -> tuple[torch.Tensor, dict]:
        """Every row's fp32 soft mixture [B, d] at a decode step, and what the rollout records of it (record name ->
        [B, ...], kept where the step is soft). ``scaled``: z_t / T_s [B, V]; ``filtered``: the tempered, filtered
        scores ``v_t`` was drawn from; ``noise(stream, width, normal=False)``: [B, width] draws of the step."""
        raise NotImplementedError

    def recorded_mixture(self, embedding, recorded: dict, chunk_size: int) -> torch.Tensor:
        """The fp32 mixtures [n, d] of ``n`` recorded soft steps (``recorded``: the rollout's records there)."""
        raise NotImplementedError

    def feed(self, token_embedding: torch.Tensor, mixture: torch.Tensor) -> torch.Tensor:
        """What a soft step feeds, given ``E(v_t)`` and its fp32 mixture (any leading shape), in ``E``'s dtype.

            >>> TopKMixture().feed(torch.zeros(1, 2, dtype=torch.bfloat16), torch.tensor([[0.5, 1.5]]))
            tensor([[0.5000, 1.5000]], dtype=torch.bfloat16)
        """
        return mixture.to(token_embedding.dtype)

    def draw_log_density(self, logits, embedding, recorded: dict, temperature: float) -> torch.Tensor:
        """log-density [n] of ``n`` recorded draws under the current policy's fp32 ``logits`` [n, V]."""
        raise TypeError(f"soft input {self.name!r} is not a random draw: it has no log-density")


def _topk_records(embedding, scaled, k):
    ids, weights = soft_topk(scaled, k)
    return topk_mixture(embedding, ids, weights), dict(soft_ids=ids, soft_weights=weights)


def _recorded_topk(embedding, recorded, chunk_size):
    """The top-k mixtures of recorded ids and weights, ``chunk_size`` steps at a time (bounding the fp32 [n, k, d]
    gather: k = 30, d = 2048 is 250 MB a chunk of 1,024)."""
    ids, weights = recorded["soft_ids"], recorded["soft_weights"]
    return torch.cat([topk_mixture(embedding, ids[s:s + chunk_size], weights[s:s + chunk_size])
                      for s in range(0, ids.shape[0], chunk_size)])


@registered
class TopKMixture(SoftInputBase):
    """TARPO's soft input (module docstring): the top-k mixture, rebuilt in training from the recorded ids and
    fp32 weights (k ids and k floats a soft step)."""

    name = TOP_K

    def draw(self, embedding, scaled, filtered, k, noise):
        return _topk_records(embedding, scaled, k)

    def recorded_mixture(self, embedding, recorded, chunk_size):
        return _recorded_topk(embedding, recorded, chunk_size)

    @classmethod
    def load(cls, adapter, device=None) -> "TopKMixture":
        """The soft input an evaluation of a model trained with it decodes with (nothing to read: no parameters)."""
        return cls()


TOP_K_MIXTURE = TopKMixture()  # stateless: the one every top-k routing shares


@registered
class HrpoGate(SoftInputBase, nn.Module):
    """HRPO's gate; parameters in fp32 (like the router), applied to soft (thinking) rows.

    ``mixture`` says which mixture ``m`` the gate blends (module docstring): ``"full"``, HRPO's
    ``(p · E) / ‖p‖₂`` built by :func:`tarpo.engine.mixture.normalised_full_mixture` and used as it is,
    or ``"top_k"``, the top-k mixture rescaled here to ``‖e‖``. It is saved with the weights, so
    evaluation blends the mixture training used.
    """

    name = HRPO_GATE
    weights_file = HRPO_WEIGHTS

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

    @classmethod
    def for_run(cls, args, model) -> "HrpoGate":
        """Initialised as HRPO's: N(0, initializer_range) weights, zero biases, seeded by the run's seed."""
        return cls(model.config.hidden_size, c=args.hrpo_c, seed=args.seed,
                   init_std=getattr(model.config, "initializer_range", 0.02), mixture=args.hrpo_mixture)

    @classmethod
    def full_mixture(cls, setting) -> bool:
        """HRPO's own mixture is the full one; ``hrpo_mixture="top_k"`` records the top-k ids and weights instead.

            >>> [HrpoGate.full_mixture({"hrpo_mixture": m}.get) for m in ("full", "top_k")]
            [True, False]
        """
        return setting("hrpo_mixture") == "full"

    def setting(self, name):
        return {"hrpo_mixture": self.mixture}[name]

    def draw(self, embedding, scaled, filtered, k, noise):
        if self.mixture == "top_k":
            return _topk_records(embedding, scaled, k)
        mixed = normalised_full_mixture(filtered, embedding)  # p is the distribution v_t was drawn from
        return mixed, dict(soft_inputs=mixed)

    def recorded_mixture(self, embedding, recorded, chunk_size):
        if self.mixture == "top_k":
            return _recorded_topk(embedding, recorded, chunk_size)
        return recorded["soft_inputs"].float()

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

    def feed(self, token_embedding, mixture):
        return self(token_embedding, mixture).to(token_embedding.dtype)

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


@registered
class GaussianSoftTokens(SoftInputBase):
    """Soft Tokens' noisy full mixture; ``sigma = scale * rms(E)`` fixed at construction."""

    name = GAUSSIAN
    density_reads = ("soft_inputs",)

    def __init__(self, embedding: torch.Tensor, scale: float = 0.33):
        self.sigma = float(scale * embedding.detach().float().pow(2).mean().sqrt())

    @classmethod
    def for_run(cls, args, model) -> "GaussianSoftTokens":
        return cls(model.get_input_embeddings().weight, args.soft_tokens_noise_scale)

    @classmethod
    def full_mixture(cls, setting) -> bool:
        return True

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


@registered
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

    def __init__(self, temperature: float = 0.5):
        self.temperature = float(temperature)

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
