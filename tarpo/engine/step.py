"""The one decode step of docs/algorithm.md §1, run by both rollout engines::

    h_t -> logits -> filters -> token v_t -> log-prob, entropy -> answer-tag automaton
        -> router d_t -> soft input (top-k mixture, full mixture, Gaussian; HRPO's gate) -> next input

:func:`hybrid_step` computes it for every row of a batch at once, with fixed shapes and no host
sync. The compiled engine (:mod:`tarpo.engine.static_decode`) traces it, with the decoder call, into one
graph; the eager engine (:mod:`tarpo.engine.rollout`) calls it as it is on the rows still running. The
engines differ only around it: the cache (static, or dynamic with finished rows dropped), where a
step's records are written, and when the loop stops.

Randomness comes from one of two sources. Keyed noise (``keys``, :func:`tarpo.engine.sampling.row_keys`)
is a pure function of (seed, row id, step): the compiled engine always draws so, and the eager one
when given a ``noise_seed``; both then draw the same trajectory. Without keys the eager engine draws
from ``generator`` (or torch's stream) as ``generate`` does: ``torch.multinomial`` for the token,
``torch.rand`` for the router, ``torch.randn`` for the soft rows' Gaussian noise.

A worked example, hard routing on a two-token vocabulary (token 1 is EOS)::

    >>> from types import SimpleNamespace as NS
    >>> E = torch.eye(2)
    >>> bb = NS(embed_weight=E, logits=lambda h: h)
    >>> c = StepSettings(temperature=1.0, top_k=0, top_p=1.0, soft_top_k=2, routing="hard", entropy_threshold=0.5,
    ...                  entropy_temperature=1.0, entropy_soft_when="high", router_greedy=False, greedy=True,
    ...                  last_step=3, pad_token_id=0, full_mix=False, gaussian=False, sigma=0.0, gumbel_temperature=0.0)
    >>> state = new_state(2, "cpu")
    >>> no_tag = torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.bool)
    >>> out = hybrid_step(c, bb, None, None, torch.tensor([[2.0, 0.0], [0.0, 2.0]]), state, 0, None, None,
    ...                   *no_tag, torch.tensor([1]))
    >>> out.tokens.tolist(), out.records["decided"].tolist(), out.state["alive"].tolist(), out.inputs.tolist()
    ([0, 1], [True, False], [True, False], [[1.0, 0.0], [0.0, 1.0]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..routing import ALWAYS, ENTROPY, NEVER, ROUTINGS
from . import tag_automaton
from .latent import GaussianSoftTokens, GumbelTopK
from .mixture import normalised_full_mixture, soft_step_input, soft_topk, topk_mixture
from .sampling import (STREAM_GAUSSIAN, STREAM_GUMBEL, STREAM_ROUTE, STREAM_TOKEN, filter_logits, gumbel_argmax,
                       logprobs_and_entropy, sample_tokens, step_normals, step_uniforms)


@dataclass(frozen=True)
class StepSettings:
    """The Python constants of a step (the compiled engine's graph specialises on them)."""

    temperature: float
    top_k: int
    top_p: float
    soft_top_k: int
    routing: str         # a rule of tarpo.routing.ROUTINGS
    entropy_threshold: float
    entropy_temperature: float
    entropy_soft_when: str  # 'high' or 'low': routing 'entropy' goes soft above / below the threshold
    router_greedy: bool
    greedy: bool
    last_step: int       # the last step allowed (max_new_tokens - 1): no decision there
    pad_token_id: int
    full_mix: bool       # soft steps feed a recorded full-vocabulary mixture (HRPO "full", Soft Tokens)
    gaussian: bool       # Soft Tokens
    sigma: float         # Soft Tokens' noise std
    gumbel_temperature: float  # > 0: soft steps' top-k weights are a Gumbel-softmax draw at this temperature

    @classmethod
    def of(cls, spec, pad_token_id: int, latent=None) -> "StepSettings":
        """The settings of a :class:`tarpo.engine.rollout.RolloutSpec` and the routing's latent module."""
        gaussian, gate = ROUTINGS[spec.routing].gaussian, step_gate(spec.routing, latent)
        return cls(temperature=float(spec.temperature), top_k=int(spec.top_k), top_p=float(spec.top_p),
                   soft_top_k=int(spec.soft_top_k), routing=spec.routing,
                   entropy_threshold=float(spec.entropy_threshold),
                   entropy_temperature=float(spec.entropy_temperature),
                   entropy_soft_when=str(spec.entropy_soft_when), router_greedy=bool(spec.router_greedy),
                   greedy=bool(spec.greedy), last_step=int(spec.max_new_tokens) - 1, pad_token_id=int(pad_token_id),
                   full_mix=gaussian or (gate is not None and gate.mixture == "full"), gaussian=gaussian,
                   sigma=float(latent.sigma) if gaussian else 0.0,
                   gumbel_temperature=float(latent.temperature) if ROUTINGS[spec.routing].gumbel else 0.0)


def step_gate(routing: str, latent):
    """The gate a soft step's input goes through: HRPO's (``latent``) under a gated rule, else None."""
    return latent if ROUTINGS[routing].gate else None


class StepOut(NamedTuple):
    inputs: torch.Tensor   # [B, d] in E's dtype: the next input of every row
    tokens: torch.Tensor   # [B] v_t as drawn (also for rows that had ended)
    records: dict          # name -> this step's entry of each record of tarpo.engine.records.new_records, [B, ...]
    state: dict            # the next loop state (new_state's keys)


def new_state(batch: int, device) -> dict:
    """The loop state before step 0: tag automaton at its start, every row thinking and running."""
    return dict(tag=torch.zeros(batch, dtype=torch.long, device=device),
                thinking=torch.ones(batch, dtype=torch.bool, device=device),
                alive=torch.ones(batch, dtype=torch.bool, device=device),
                ended=torch.zeros(batch, dtype=torch.bool, device=device))


def hybrid_step(c: StepSettings, backbone, router, gate, hidden, state: dict, t, keys, generator,
                next_tag, hit_tag, eos) -> StepOut:
    """Step ``t`` (int or 0-d tensor) for every row, from the final hidden states ``hidden`` [B, d].

    ``state``: ``tag`` [B] automaton states, ``thinking`` / ``alive`` / ``ended`` [B] bool;
    ``next_tag``, ``hit_tag``: the answer tag's automaton (:func:`tarpo.engine.tag_automaton.tables`);
    ``eos`` [n] the ids that end a row. A row that has ended draws but records nothing
    (pad, False, 0, as a step that never ran) and never decides.
    """
    E, alive = backbone.embed_weight, state["alive"]
    logits = backbone.logits(hidden).float()
    filtered = filter_logits(logits, c.temperature, c.top_k, c.top_p)
    tokens = _draw_token(c, filtered, t, keys, generator)
    scaled = logits / c.temperature
    logp_all, entropy = logprobs_and_entropy(scaled)

    tag, hit = tag_automaton.step(state["tag"], tokens, next_tag, hit_tag)
    thinking = state["thinking"] & ~hit
    is_eos = torch.isin(tokens, eos)
    decide = alive & thinking & ~is_eos & (t < c.last_step)
    soft, p_soft = _route(c, router, hidden, logits, entropy, decide, t, keys, generator)
    inputs, ids, weights, mixed = _next_inputs(c, E, tokens, scaled, filtered, soft, gate, t, keys, generator)

    zero = torch.zeros((), dtype=torch.float32, device=entropy.device)
    records = dict(token_ids=torch.where(alive, tokens, c.pad_token_id), completion_mask=alive, is_soft=soft,
                   decided=decide, p_soft=p_soft, entropy=torch.where(alive, entropy, zero),
                   logp=torch.where(alive, logp_all.gather(-1, tokens[:, None]).squeeze(-1), zero))
    if ids is not None:
        records.update(soft_ids=torch.where(soft[:, None], ids, 0), soft_weights=torch.where(soft[:, None], weights, zero))
    if c.full_mix:
        records["soft_inputs"] = torch.where(soft[:, None], mixed, zero)
    state = dict(tag=tag, thinking=thinking, alive=alive & ~is_eos, ended=state["ended"] | (alive & is_eos))
    return StepOut(inputs, tokens, records, state)


def _draw_token(c, filtered, t, keys, generator):
    """v_t ~ softmax(filtered): argmax when greedy, Gumbel-max on keyed noise, or ``torch.multinomial``."""
    if c.greedy:
        return filtered.argmax(-1)
    if keys is not None:
        return gumbel_argmax(filtered, step_uniforms(keys, t, STREAM_TOKEN, filtered.shape[-1]))
    return sample_tokens(filtered, False, generator)


def _route(c, router, hidden, logits, entropy, decide, t, keys, generator):
    """d_t (bool [B], True = soft) for the rows in ``decide``, and rho(soft|h_t) (0 where no learned decision)."""
    p_soft, when = torch.zeros_like(entropy), ROUTINGS[c.routing].soft_when
    if when == NEVER:
        return torch.zeros_like(decide), p_soft
    if when == ALWAYS:
        return decide, p_soft
    if when == ENTROPY:  # the entropy of softmax(z_t / entropy_temperature)
        if c.entropy_temperature != c.temperature:
            entropy = logprobs_and_entropy(logits / c.entropy_temperature)[1]
        above = entropy > c.entropy_threshold
        return decide & (above if c.entropy_soft_when == "high" else ~above), p_soft
    p = router.log_probs(hidden)[:, 1].exp()  # ROUTER
    if c.router_greedy:
        soft = p > 0.5
    else:
        u = (step_uniforms(keys, t, STREAM_ROUTE, 1)[:, 0] if keys is not None else
             torch.rand(p.shape, device=p.device, generator=generator))
        soft = u < p
    return decide & soft, torch.where(decide, p, p_soft)


def _next_inputs(c, E, tokens, scaled, filtered, soft, gate, t, keys, generator):
    """Every row's next input (``E(v_t)``, or the soft input where ``soft``) and what a soft step
    records of it: top-k ids and weights, or the fp32 full mixture (the other two are None)."""
    ids = weights = None
    if c.gaussian:
        d = E.shape[1]
        noise = step_normals(keys, t, STREAM_GAUSSIAN, d) if keys is not None else _normals(soft, d, generator)
        mixed = GaussianSoftTokens.input(scaled, E, c.sigma, noise)
    elif c.full_mix:  # HRPO: p is the distribution v_t was drawn from
        mixed = normalised_full_mixture(filtered, E)
    else:
        ids, weights = soft_topk(scaled, c.soft_top_k)
        if c.gumbel_temperature:  # exploration inside the soft mode: a Gumbel-softmax draw of the weights
            k = c.soft_top_k
            u = step_uniforms(keys, t, STREAM_GUMBEL, k) if keys is not None else _uniforms(soft, k, generator)
            weights = GumbelTopK.weights(scaled.gather(-1, ids), u, c.gumbel_temperature)
        mixed = topk_mixture(E, ids, weights)
    e = E[tokens]
    return torch.where(soft[:, None], soft_step_input(e, mixed, gate), e), ids, weights, mixed


def _uniforms(soft, k, generator):
    """Uniforms [B, k] in (0, 1) from ``generator``, drawn for every row (counting the soft rows first would
    read them on the host) and used where ``soft``."""
    return torch.rand(soft.shape[0], k, device=soft.device, generator=generator).clamp(1e-7, 1 - 1e-7)


def _normals(soft, d, generator):
    """Standard normals [B, d] fp32 from ``generator``, drawn for every row, used where ``soft``."""
    return torch.randn(soft.shape[0], d, device=soft.device, generator=generator, dtype=torch.float32)
