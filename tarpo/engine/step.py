"""The one decode step of docs/algorithm.md §1, run by both rollout engines::

    h_t -> logits -> filters -> token v_t -> log-prob, entropy -> answer-tag automaton
        -> router d_t -> soft input (tarpo.engine.soft_input: top-k mixture, HRPO's gate, Gaussian, Gumbel)
        -> next input

:func:`hybrid_step` computes it for every row of a batch at once, with fixed shapes and no host
sync; what stays the same over a rollout (settings, modules, tag tables, end ids) comes in one
:class:`DecodeContext`, built once per rollout. The compiled engine (:mod:`tarpo.engine.static_decode`)
traces it, with the decoder call, into one graph; the eager engine (:mod:`tarpo.engine.rollout`) calls
it as it is on the rows still running. The engines differ only around it: the cache (static, or
dynamic with finished rows dropped), where a step's records are written, and when the loop stops.

Randomness comes from one of two sources. Keyed noise (``keys``, :func:`tarpo.engine.sampling.row_keys`)
is a pure function of (seed, row id, step): the compiled engine always draws so, and the eager one
when given a ``noise_seed``; both then draw the same trajectory. Without keys the eager engine draws
from the context's ``generator`` (or torch's stream) as ``generate`` does: ``torch.multinomial`` for the
token, ``torch.rand`` for the router, ``torch.randn`` for the soft rows' Gaussian noise.

A worked example, hard routing on a two-token vocabulary (token 1 is EOS)::

    >>> from types import SimpleNamespace as NS
    >>> from tarpo.engine.rollout import RolloutSpec
    >>> from tarpo.engine.soft_input import TOP_K_MIXTURE
    >>> E = torch.eye(2)
    >>> bb = NS(embed_weight=E, logits=lambda h: h, lm_head=NS(weight=E))
    >>> spec = RolloutSpec(max_new_tokens=4, temperature=1.0, top_k=0, top_p=1.0, soft_top_k=2, routing="hard",
    ...                    greedy=True)
    >>> policy = Policy(bb, ["a", "b"].__getitem__, eos_token_ids=[1], pad_token_id=0, router=None,
    ...                 soft_input=TOP_K_MIXTURE)
    >>> ctx = DecodeContext.build(spec, policy, "cpu")
    >>> out = hybrid_step(ctx, torch.tensor([[2.0, 0.0], [0.0, 2.0]]), new_state(2, "cpu"), 0, None)
    >>> out.tokens.tolist(), out.records["decided"].tolist(), out.state["alive"].tolist(), out.inputs.tolist()
    ([0, 1], [True, False], [True, False], [[1.0, 0.0], [0.0, 1.0]])
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ..algorithms import ALWAYS, ENTROPY, NEVER
from . import tag_automaton
from .sampling import (STREAM_ROUTE, STREAM_TOKEN, filter_logits, gumbel_argmax, logprobs_and_entropy, sample_tokens,
                       step_normals, step_uniforms)


class Policy(NamedTuple):
    """The model side of a rollout: what decodes and routes, and how the tokenizer's ids read. The trainer and
    the evaluation build it from parts they keep (the trainer once per rollout, as its backbone is remade)."""

    backbone: object                 # tarpo.engine.backbone.Backbone: the policy's embedding, decoder and head
    token_text: Callable[[int], str]  # token id -> text, read by the answer tag's automaton (tagging.token_text_fn)
    eos_token_ids: object            # the ids that end a row
    pad_token_id: int
    router: object                   # tarpo.engine.router.Router; None but under the learned routings
    soft_input: object               # what a soft step feeds: the routing's soft input (tarpo.engine.soft_input)


class DecodeContext(NamedTuple):
    """What every step of one rollout reads and none changes, built once per rollout (:meth:`build`).

    The settings are the rollout's :class:`tarpo.engine.rollout.RolloutSpec` itself (frozen), their one
    owner; the modules (router, soft input) and the tokenizer's tables come from the :class:`Policy`.
    A NamedTuple, so that dynamo takes it apart as it is when the compiled engine's step
    (:func:`tarpo.engine.static_decode.decode_step`) receives it: the graph reads its tensors as inputs
    and specialises on its Python constants."""

    spec: object          # tarpo.engine.rollout.RolloutSpec: temperature, top_k/p, soft_top_k, routing, ...
    backbone: object      # the policy (tarpo.engine.backbone.Backbone): embedding and head
    router: object        # tarpo.engine.router.Router; read only by the learned routings
    soft_input: object    # what a soft step feeds (tarpo.engine.soft_input), the routing's
    next_tag: torch.Tensor  # [S, V] long and [S, V] bool: the answer tag's automaton
    hit_tag: torch.Tensor   # (tarpo.engine.tag_automaton.tables)
    eos: torch.Tensor     # [n] the ids that end a row
    pad_token_id: int
    generator: torch.Generator | None = None  # where a step without keys draws (None: torch's stream)

    @property
    def mixture_width(self) -> int:
        """``d`` where a soft step records its full mixture (``Rollout.soft_inputs``), else 0."""
        return self.backbone.embed_weight.shape[1] if self.soft_input.records_mixture else 0

    @classmethod
    def build(cls, spec, policy: Policy, device, generator=None) -> "DecodeContext":
        """The context of a rollout of ``policy`` under ``spec`` (the routing's needs checked), its tag tables
        and end ids on ``device``."""
        r, soft_input = spec.rule, policy.soft_input
        if r.router and policy.router is None:
            raise ValueError(f"routing={spec.routing!r} needs a router")
        if getattr(soft_input, "name", None) != r.soft_input:
            raise ValueError(f"routing={spec.routing!r} needs its soft input {r.soft_input!r} (a "
                             f"tarpo.engine.soft_input.{r.soft_input} object), not {type(soft_input).__name__}")
        vocab = policy.backbone.lm_head.weight.shape[0]
        next_tag, hit_tag = tag_automaton.tables(policy.token_text, spec.answer_tag, vocab, device)
        eos = torch.as_tensor(list(policy.eos_token_ids), dtype=torch.long, device=device)
        return cls(spec, policy.backbone, policy.router, soft_input, next_tag, hit_tag, eos, int(policy.pad_token_id),
                   generator=generator)


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


def hybrid_step(ctx: DecodeContext, hidden, state: dict, t, keys) -> StepOut:
    """Step ``t`` (int or 0-d tensor) for every row, from the final hidden states ``hidden`` [B, d].

    ``state``: ``tag`` [B] automaton states, ``thinking`` / ``alive`` / ``ended`` [B] bool; ``keys`` [B] the
    rows' noise keys, or None (draws from ``ctx.generator``). A row that has ended draws but records nothing
    (pad, False, 0, as a step that never ran) and never decides; no decision at the last step allowed.
    """
    spec, alive = ctx.spec, state["alive"]
    logits = ctx.backbone.logits(hidden).float()
    filtered = filter_logits(logits, spec.temperature, spec.top_k, spec.top_p, spec.min_p)
    tokens = _draw_token(ctx, filtered, t, keys)
    scaled = logits / spec.temperature
    logp_all, entropy = logprobs_and_entropy(scaled)

    tag, hit = tag_automaton.step(state["tag"], tokens, ctx.next_tag, ctx.hit_tag)
    thinking = state["thinking"] & ~hit
    is_eos = torch.isin(tokens, ctx.eos)
    decide = alive & thinking & ~is_eos & (t < spec.max_new_tokens - 1)
    soft, p_soft = _route(ctx, hidden, logits, entropy, decide, t, keys)
    inputs, soft_records = _next_inputs(ctx, tokens, scaled, filtered, soft, t, keys)

    zero = torch.zeros((), dtype=torch.float32, device=entropy.device)
    records = dict(token_ids=torch.where(alive, tokens, ctx.pad_token_id), completion_mask=alive, is_soft=soft,
                   decided=decide, p_soft=p_soft, entropy=torch.where(alive, entropy, zero),
                   logp=torch.where(alive, logp_all.gather(-1, tokens[:, None]).squeeze(-1), zero))
    records.update({name: torch.where(soft[:, None], value, value.new_zeros(()))
                    for name, value in soft_records.items()})
    state = dict(tag=tag, thinking=thinking, alive=alive & ~is_eos, ended=state["ended"] | (alive & is_eos))
    return StepOut(inputs, tokens, records, state)


def _draw_token(ctx, filtered, t, keys):
    """v_t ~ softmax(filtered): argmax when greedy, Gumbel-max on keyed noise, or ``torch.multinomial``."""
    if ctx.spec.greedy:
        return filtered.argmax(-1)
    if keys is not None:
        return gumbel_argmax(filtered, step_uniforms(keys, t, STREAM_TOKEN, filtered.shape[-1]))
    return sample_tokens(filtered, False, ctx.generator)


def _route(ctx, hidden, logits, entropy, decide, t, keys):
    """d_t (bool [B], True = soft) for the rows in ``decide``, and rho(soft|h_t) (0 where no learned decision)."""
    spec = ctx.spec
    p_soft, when = torch.zeros_like(entropy), spec.rule.soft_when
    if when == NEVER:
        return torch.zeros_like(decide), p_soft
    if when == ALWAYS:
        return decide, p_soft
    if when == ENTROPY:  # the entropy of softmax(z_t / entropy_temperature)
        if spec.entropy_temperature != spec.temperature:
            entropy = logprobs_and_entropy(logits / spec.entropy_temperature)[1]
        above = entropy > spec.entropy_threshold
        return decide & (above if spec.entropy_soft_when == "high" else ~above), p_soft
    p = ctx.router.log_probs(hidden)[:, 1].exp()  # ROUTER
    if spec.router_greedy:
        soft = p > 0.5
    else:
        u = (step_uniforms(keys, t, STREAM_ROUTE, 1)[:, 0] if keys is not None else
             torch.rand(p.shape, device=p.device, generator=ctx.generator))
        soft = u < p
    return decide & soft, torch.where(decide, p, p_soft)


def _next_inputs(ctx, tokens, scaled, filtered, soft, t, keys):
    """Every row's next input (``E(v_t)``, or what the soft input feeds where ``soft``) and what the rollout
    records of a soft step (:meth:`tarpo.engine.soft_input.SoftInputBase.draw`)."""
    E = ctx.backbone.embed_weight

    def noise(stream, width, normal=False):  # [B, width] draws of this step: keyed, or from the generator
        if keys is not None:
            return (step_normals if normal else step_uniforms)(keys, t, stream, width)
        return _normals(soft, width, ctx.generator) if normal else _uniforms(soft, width, ctx.generator)

    mixed, recorded = ctx.soft_input.draw(E, scaled, filtered, ctx.spec.soft_top_k, noise)
    e = E[tokens]
    return torch.where(soft[:, None], ctx.soft_input.feed(e, mixed), e), recorded


def _uniforms(soft, k, generator):
    """Uniforms [B, k] in (0, 1) from ``generator``, drawn for every row (counting the soft rows first would
    read them on the host) and used where ``soft``."""
    return torch.rand(soft.shape[0], k, device=soft.device, generator=generator).clamp(1e-7, 1 - 1e-7)


def _normals(soft, d, generator):
    """Standard normals [B, d] fp32 from ``generator``, drawn for every row, used where ``soft``."""
    return torch.randn(soft.shape[0], d, device=soft.device, generator=generator, dtype=torch.float32)
