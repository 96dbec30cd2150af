"""The compiled hybrid decode engine (``RolloutSpec.engine = "compiled"``): one static-shape step.

The eager engine (:func:`tarpo.rollout.hybrid_generate` with ``engine="eager"``) is the
reference: a ``DynamicCache`` that grows by ``torch.cat``, finished rows dropped, the tag
tracker in Python, a dozen GPU->CPU syncs a step. This engine runs the same decision
process as one function with fixed shapes and no host sync, compiled once with
``torch.compile(fullgraph=True)`` (``mode="reduce-overhead"``, CUDA graphs, on CUDA)::

    h_t -> logits -> filters -> token (Gumbel-max on keyed noise) -> log-prob, entropy
        -> router draw (keyed noise) -> answer-tag automaton -> top-k mixture (dense)
        -> next input (torch.where soft/hard) -> records written at step t -> decoder -> h_t+1

- **Cache and mask.** A ``StaticCache`` of ``L`` positions, ``L`` = prompt + new tokens rounded
  up to a multiple of :data:`CACHE_BUCKET` (one compiled graph serves every prompt length of a
  bucket). The prompt is prefilled eagerly once; the attention mask is the prompt's mask
  followed by ones, allocated once: causality hides positions not yet written.
- **Fixed batch.** Finished rows are not dropped; they ride along and write nothing (their
  records keep pad / False / 0, as the eager engine's). Every ``DONE_CHECK_EVERY`` steps
  the loop looks at a flag "some row is still running" copied without blocking at the
  previous check, and stops once it reads False.
- **Randomness** is keyed noise (:func:`tarpo.sampling.step_uniforms`), a pure function of
  (seed, row id, step) computed inside the graph. Given the same seed the eager engine draws
  the same trajectory.
- **Records** live in buffers of the full ``[B, T]`` shape, written with ``index_copy_`` at a
  step index held as a tensor; they are cut to the steps that ran and copied out at the end.

The engine (cache, buffers, tag tables) is kept on the model for the next rollout of the same
shape; the compiled step is shared by all engines, and dynamo recompiles only for a new
shape or a new setting (bucketed cache length, batch size, routing).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers import StaticCache

from . import tag_automaton
from .backbone import Backbone, positions_from_mask, unwrap
from .latent import GaussianSoftTokens
from .mixture import normalised_full_mixture, soft_topk, topk_mixture
from .sampling import (STREAM_GAUSSIAN, STREAM_ROUTE, STREAM_TOKEN, filter_logits, gumbel_argmax,
                       logprobs_and_entropy, step_normals, step_uniforms)

CACHE_BUCKET = 64      # cache lengths are rounded up to a multiple of this (docs/rollout-engines.md)
RECOMPILE_LIMIT = 64   # graphs of decode_step before dynamo fails (its default, 8, then runs eagerly)


@dataclass(frozen=True)
class StepSettings:
    """The Python constants of one compiled step (dynamo specialises on them)."""

    temperature: float
    top_k: int
    top_p: float
    soft_top_k: int
    routing: str
    entropy_threshold: float
    entropy_temperature: float
    router_greedy: bool
    greedy: bool
    last_step: int
    pad_token_id: int
    full_mix: bool       # soft steps feed a recorded full-vocabulary mixture (HRPO "full", Soft Tokens)
    gaussian: bool       # Soft Tokens
    sigma: float         # Soft Tokens' noise std


def decode_step(backbone, router, gate, c: StepSettings, hidden, state, rec, cache, mask, next_tag, hit_tag,
                eos, keys):
    """One decode step for every row; returns ``(h_{t+1}, state_{t+1})`` and writes ``rec[:, t]``.

    ``state``: ``t`` (0-d long), ``pos`` [B] next position ids, ``tag`` [B] automaton states,
    ``thinking`` / ``alive`` / ``ended`` [B] bool; ``keys`` [B]: the rows' noise keys. The decisions
    are those of the eager engine (:func:`tarpo.rollout._decode`), computed densely for all rows.
    """
    t, alive = state["t"], state["alive"]
    E = backbone.embed_weight
    logits = backbone.logits(hidden).float()
    filtered = filter_logits(logits, c.temperature, c.top_k, c.top_p)
    tokens = (filtered.argmax(-1) if c.greedy else
              gumbel_argmax(filtered, step_uniforms(keys, t, STREAM_TOKEN, filtered.shape[-1])))
    scaled = logits / c.temperature
    logp_all, entropy = logprobs_and_entropy(scaled)

    tag, hit = tag_automaton.step(state["tag"], tokens, next_tag, hit_tag)
    thinking = state["thinking"] & ~hit
    is_eos = torch.isin(tokens, eos)
    decide = alive & thinking & ~is_eos & (t < c.last_step)

    p_soft = torch.zeros_like(entropy)
    if c.routing == "hard":
        soft = torch.zeros_like(decide)
    elif c.routing == "entropy":
        route_entropy = entropy
        if c.entropy_temperature != c.temperature:
            route_entropy = logprobs_and_entropy(logits / c.entropy_temperature)[1]
        soft = decide & (route_entropy > c.entropy_threshold)
    elif c.routing == "learned":
        p = router.log_probs(hidden)[:, 1].exp()
        soft = decide & ((p > 0.5) if c.router_greedy else (step_uniforms(keys, t, STREAM_ROUTE, 1)[:, 0] < p))
        p_soft = torch.where(decide, p, p_soft)
    else:  # soft, hrpo, soft_tokens: every thinking step
        soft = decide

    e = E[tokens]
    soft_ids = soft_w = None
    if c.gaussian:
        mixed = GaussianSoftTokens.mean(scaled, E) + c.sigma * step_normals(keys, t, STREAM_GAUSSIAN, E.shape[1])
    elif c.full_mix:
        mixed = normalised_full_mixture(filtered, E)
    else:
        soft_ids, soft_w = soft_topk(scaled, c.soft_top_k)
        mixed = topk_mixture(E, soft_ids, soft_w)
    soft_input = gate(e, mixed) if gate is not None else mixed.to(E.dtype)
    inputs = torch.where(soft[:, None], soft_input, e)

    index = t.view(1)
    zero = torch.zeros((), dtype=torch.float32, device=entropy.device)

    def write(name, value):
        rec[name].index_copy_(1, index, value.unsqueeze(1))

    write("token_ids", torch.where(alive, tokens, c.pad_token_id))
    write("completion_mask", alive)
    write("is_soft", soft)
    write("decided", decide)
    write("p_soft", p_soft)
    write("entropy", torch.where(alive, entropy, zero))
    write("logp", torch.where(alive, logp_all.gather(-1, tokens[:, None]).squeeze(-1), zero))
    if soft_ids is not None:
        write("soft_ids", torch.where(soft[:, None], soft_ids, 0))
        write("soft_weights", torch.where(soft[:, None], soft_w, zero))
    if c.full_mix:
        write("soft_inputs", torch.where(soft[:, None], mixed, zero))

    pos = state["pos"]
    out = backbone.decoder(inputs_embeds=inputs[:, None], attention_mask=mask, position_ids=pos[:, None],
                           past_key_values=cache, use_cache=True)
    new_state = dict(t=t + 1, pos=pos + 1, tag=tag, thinking=thinking, alive=alive & ~is_eos,
                     ended=state["ended"] | (alive & is_eos))
    return out.last_hidden_state[:, -1], new_state


GROUPED_DECODE = "tarpo_grouped_decode"


def grouped_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention of one new position against a cache with fewer K/V heads than query heads.

    transformers' SDPA path copies K and V once per query head of a group (``repeat_kv``)
    whenever there is a padding mask: at every decode step, the whole static cache, times the
    group size. For a single query position the group's query heads can be laid along the
    query-length axis instead, ``[B, H, 1, D] -> [B, H_kv, H / H_kv, D]``, and attend to the
    cache as it is; the mask ``[B, 1, 1, L]`` broadcasts over them. Query head ``h`` reads K/V
    head ``h // (H / H_kv)``, as ``repeat_kv`` arranges. Other shapes (the prefill) go to SDPA.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    B, H, q_len, D = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or kv_heads == H:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    grouped = query.reshape(B, kv_heads, H // kv_heads, D)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask,
                                                           scale=scaling)
    return out.reshape(B, H, 1, D).transpose(1, 2).contiguous(), None


class grouped_decode_attention_on:
    """Context: the model's attention is :func:`grouped_decode_attention` (registered with
    transformers' attention and mask interfaces; masks as for SDPA), restored on exit."""

    def __init__(self, config):
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

        AttentionInterface.register(GROUPED_DECODE, grouped_decode_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_DECODE, sdpa_mask)
        self.config = config

    def __enter__(self):
        self.was = self.config._attn_implementation
        self.config._attn_implementation = GROUPED_DECODE

    def __exit__(self, *exc):
        self.config._attn_implementation = self.was


_COMPILED: dict[str, object] = {}


def compiled_step(device: torch.device):
    """``decode_step`` under ``torch.compile(fullgraph=True)``; CUDA graphs on CUDA. One per mode."""
    mode = "reduce-overhead" if device.type == "cuda" else None
    if mode not in _COMPILED:
        # One graph per setting and shape; past dynamo's default of 8 recompiles a function would
        # quietly run eagerly: allow more, and fail loudly instead.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        _COMPILED[mode] = torch.compile(decode_step, fullgraph=True, dynamic=False, mode=mode)
    return _COMPILED[mode]


_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def tag_tables(piece, tag: str, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The answer-tag automaton of :mod:`tarpo.tag_automaton` for a piece function, built once
    (it decodes every id: a few seconds for a 150k vocabulary) and kept while ``piece`` lives."""
    per_piece = _TABLES.setdefault(piece, {})
    key = (tag, vocab, str(device))
    if key not in per_piece:
        nxt, hit = tag_automaton.build([piece(i) for i in range(vocab)], tag)
        per_piece[key] = (nxt.to(device), hit.to(device))
    return per_piece[key]


class _LateFlag:
    """A bool copied to the host without blocking; read one check later, when the copy is done."""

    def __init__(self):
        self.value, self.event = None, None

    def read_then_post(self, flag: torch.Tensor) -> bool | None:
        """The flag posted at the previous check (None the first time); posts ``flag``."""
        previous = None
        if self.value is not None:
            if self.event is not None:
                self.event.synchronize()
            previous = bool(self.value)
        if flag.device.type == "cuda":
            self.value = flag.to("cpu", non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.value = flag
        return previous


class StaticDecoder:
    """Cache and record buffers for rollouts of one shape; reused while the shape holds."""

    def __init__(self, backbone: Backbone, key: tuple):
        from .rollout import new_records

        self.key = key
        B, T, cache_len, k, full_mix, device, _ = key
        self.cache = StaticCache(config=backbone.config, max_cache_len=cache_len)
        self.rec = new_records(B, T, k, backbone.embed_weight.shape[1] if full_mix else 0, 0, device)
        self.mask = torch.ones(B, cache_len, dtype=torch.long, device=device)
        if torch.device(device).type == "cuda":  # CUDA graphs: buffers written in the graph keep their address
            for buf in self.rec.values():
                torch._dynamo.mark_static_address(buf)

    def reset(self, pad_token_id: int, prompt_mask: torch.Tensor) -> None:
        self.cache.reset()
        for name, buf in self.rec.items():
            buf.fill_(pad_token_id if name == "token_ids" else 0)
        self.mask.fill_(1)
        self.mask[:, :prompt_mask.shape[1]] = prompt_mask


def _engine(backbone, batch, new_tokens, cache_len, k, full_mix, device) -> StaticDecoder:
    """The model's engine for this shape, made anew (replacing the last) when the shape changes."""
    base = unwrap(backbone.model)
    engine = base.__dict__.get("_tarpo_static_decoder")
    key = (batch, new_tokens, cache_len, k, full_mix, str(device), backbone.embed_weight.dtype)
    if engine is None or engine.key != key:
        base.__dict__["_tarpo_static_decoder"] = None  # free the old cache first
        engine = StaticDecoder(backbone, key)
        base.__dict__["_tarpo_static_decoder"] = engine
    return engine


def check_backbone(backbone) -> None:
    from .rollout import resolve_engine

    if resolve_engine("auto", backbone) != "compiled":
        raise ValueError(f"engine='compiled' feeds inputs_embeds to the transformers decoder with a StaticCache; "
                         f"{type(backbone).__name__} decodes through its own path (BACKEND=unsloth): use "
                         "engine='eager' with it")


@torch.no_grad()
def compiled_generate(backbone, router, prompt_ids, prompt_mask, spec, piece, eos_token_ids, pad_token_id,
                      keys: torch.Tensor, latent, gaussian: bool, gate, full_mix: bool, lockstep=None):
    """:func:`tarpo.rollout.hybrid_generate` with ``engine="compiled"`` (arguments checked and the
    routing's latent settings resolved there); ``keys``: the rows' noise keys
    (:func:`tarpo.sampling.row_keys`)."""
    from .rollout import DONE_CHECK_EVERY, Rollout, steps_that_ran

    check_backbone(backbone)
    device = prompt_ids.device
    B, P = prompt_ids.shape
    T, E = spec.max_new_tokens, backbone.embed_weight
    vocab = backbone.lm_head.weight.shape[0]
    cache_len = -(-(P + T) // CACHE_BUCKET) * CACHE_BUCKET
    engine = _engine(backbone, B, T, cache_len, spec.soft_top_k, full_mix, device)
    engine.reset(pad_token_id, prompt_mask.long())
    next_tag, hit_tag = tag_tables(piece, spec.answer_tag, vocab, device)
    settings = StepSettings(
        temperature=float(spec.temperature), top_k=int(spec.top_k), top_p=float(spec.top_p),
        soft_top_k=int(spec.soft_top_k), routing=spec.routing, entropy_threshold=float(spec.entropy_threshold),
        entropy_temperature=float(spec.entropy_temperature), router_greedy=bool(spec.router_greedy),
        greedy=bool(spec.greedy), last_step=T - 1, pad_token_id=int(pad_token_id), full_mix=full_mix,
        gaussian=gaussian, sigma=float(latent.sigma) if gaussian else 0.0)
    eos = torch.as_tensor(list(eos_token_ids), dtype=torch.long, device=device)

    with backbone.decoding(), grouped_decode_attention_on(backbone.config):
        pos = positions_from_mask(prompt_mask.long())
        prefill = backbone.decoder(inputs_embeds=E[prompt_ids], attention_mask=engine.mask[:, :P],
                                   position_ids=pos, past_key_values=engine.cache, use_cache=True)
        hidden = prefill.last_hidden_state[:, -1].contiguous()  # the layout the step returns: no recompile
        state = dict(t=torch.zeros((), dtype=torch.long, device=device), pos=pos[:, -1] + 1,
                     tag=torch.zeros(B, dtype=torch.long, device=device),
                     thinking=torch.ones(B, dtype=torch.bool, device=device),
                     alive=torch.ones(B, dtype=torch.bool, device=device),
                     ended=torch.zeros(B, dtype=torch.bool, device=device))
        step = compiled_step(device)
        flag = _LateFlag()
        for t in range(T):
            hidden, state = step(backbone, router, gate, settings, hidden, state, engine.rec, engine.cache,
                                 engine.mask, next_tag, hit_tag, eos, keys)
            if (t + 1) % DONE_CHECK_EVERY:
                continue
            if lockstep is not None:  # sharded model: every rank steps until no rank has a running row
                if not lockstep(bool(state["alive"].any())):
                    break
            elif flag.read_then_post(state["alive"].any()) is False:
                break

    steps = steps_that_ran(engine.rec["completion_mask"])
    rec = {name: buf[:, :steps].clone() for name, buf in engine.rec.items()}
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, ended_with_eos=state["ended"].clone(), **rec)
