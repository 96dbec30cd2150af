"""HRPO's gated blend, a soft input with parameters of its own (docs/algorithm.md §3; registered as
:data:`tarpo.algorithms.HRPO_GATE` beside the other soft inputs of :mod:`tarpo.engine.soft_input`).

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
"""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..algorithms import HRPO_GATE, HRPO_MIXTURES
from .mixture import normalised_full_mixture
from .precision import full_precision
from .soft_input_base import SoftInputBase, recorded_topk, topk_records, with_kind

HRPO_WEIGHTS = "hrpo_gate.safetensors"
HRPO_EPS = 1e-8  # inside the square root, as HRPO's ``thinking_residual``


@with_kind
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
    def full_mixture(cls, args) -> bool:
        """HRPO's own mixture is the full one; ``hrpo_mixture="top_k"`` records the top-k ids and weights instead.

            >>> from types import SimpleNamespace as NS
            >>> [HrpoGate.full_mixture(NS(hrpo_mixture=m)) for m in ("full", "top_k")]
            [True, False]
        """
        return args.hrpo_mixture == "full"

    @property
    def records_mixture(self) -> bool:
        return self.mixture == "full"

    @classmethod
    def trained_elements(cls, hidden_size: int) -> int:
        """W_r, W_i (d x d and a bias each) and Λ (d)."""
        return 2 * (hidden_size * hidden_size + hidden_size) + hidden_size

    def parameter_groups(self, args) -> list[dict]:
        """As HRPO's optimizer groups them: W_r and W_i at ``hrpo_lr``, Λ at ``hrpo_lambda_lr``, both with the
        weight decay."""
        maps = [p for p in self.parameters() if p is not self.lam]
        return [{"params": maps, "lr": args.hrpo_lr, "weight_decay": args.weight_decay},
                {"params": [self.lam], "lr": args.hrpo_lambda_lr, "weight_decay": args.weight_decay}]

    def draw(self, embedding, scaled, filtered, k, noise):
        if self.mixture == "top_k":
            return topk_records(embedding, scaled, k)
        mixed = normalised_full_mixture(filtered, embedding)  # p is the distribution v_t was drawn from
        return mixed, dict(soft_inputs=mixed)

    def recorded_mixture(self, embedding, recorded, chunk_size):
        if self.mixture == "top_k":
            return recorded_topk(embedding, recorded, chunk_size)
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
        """Its parameters, with ``c`` and the mixture in the file's metadata (``state``: the tensors to write, when
        this module's own are shards, tarpo.training.sharding)."""
        save_file({k: v.detach().cpu().contiguous() for k, v in (state or self.state_dict()).items()},
                  f"{directory}/{HRPO_WEIGHTS}", metadata={"c": str(self.c), "mixture": self.mixture})

    @classmethod
    def load(cls, directory: str, device=None) -> "HrpoGate":
        """The gate :meth:`save` wrote into ``directory``, on ``device``."""
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
