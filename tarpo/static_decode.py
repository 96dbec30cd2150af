"""The compiled hybrid decode engine (``RolloutSpec.engine = "compiled"``): one static-shape step.

The eager engine (:func:`tarpo.rollout.hybrid_generate` with ``engine="eager"``) is the
reference: a ``DynamicCache`` that grows by ``torch.cat``, finished rows dropped, the tag
tracker in Python, a dozen GPU->CPU syncs a step. This engine runs the same decision
process as one function with fixed shapes and no host sync, compiled once with
``torch.compile(fullgraph=True)`` and, on CUDA, replayed as one captured CUDA graph::

    h_t -> logits -> filters -> token (Gumbel-max on keyed noise) -> log-prob, entropy
        -> router draw (keyed noise) -> answer-tag automaton -> top-k mixture (dense)
        -> next input (torch.where soft/hard) -> records written at step t -> decoder -> h_t+1

- **Static buffers, nothing fed back.** The step reads and writes only buffers allocated once
  per rollout (:class:`StaticDecoder`): the cache, the mask, the hidden state ``h_t``, the
  loop state (step index, positions, tag automaton, thinking / alive / ended) and the records.
  It returns nothing, so no tensor it produced is ever an input of the next call: a captured
  CUDA graph replays the same kernels on the same addresses, and an output buffer that a
  graph runtime reuses between calls cannot corrupt the trajectory (tests poison them).
- **One shape per run.** The cache holds ``L`` positions, ``L`` = the run's prompt budget
  (``RolloutSpec.max_prompt_length``, else this batch's prompt length) + new tokens, rounded up
  to a multiple of :data:`CACHE_BUCKET`; the batch is padded to ``RolloutSpec.batch_size``
  with rows that never run. So training compiles one graph, and evaluation one per task.
  The prompt is prefilled eagerly once; the attention mask is the prompt's mask followed by
  ones: causality hides positions not yet written.
- **Fixed batch.** Finished rows are not dropped; they ride along and write nothing (their
  records keep pad / False / 0, as the eager engine's). Every ``DONE_CHECK_EVERY`` steps
  the loop looks at a flag "some row is still running" copied without blocking at the
  previous check, and stops once it reads False.
- **CUDA graphs** (:class:`GraphedStep`): the first step runs as compiled code (and compiles),
  the second is captured into a ``torch.cuda.CUDAGraph`` and every later step replays it. We
  capture by hand rather than with ``mode="reduce-overhead"``: cudagraph trees free a call's
  outputs at the next call, and would re-record for every new cache address.
- **Randomness** is keyed noise (:func:`tarpo.sampling.step_uniforms`), a pure function of
  (seed, row id, step) computed inside the graph. Given the same seed the eager engine draws
  the same trajectory.
- **Records** live in buffers of the full ``[B, T]`` shape, written with ``index_copy_`` at a
  step index held as a tensor; they are cut to the steps that ran and copied out at the end.

The buffers and the captured graph live for one rollout and are released when it returns, so
the training forward that follows has the memory (docs/rollout-engines.md). The compiled step is
shared by all rollouts; dynamo recompiles only for a new shape or setting (cache length, batch
size, routing), and the tag tables are kept per tokenizer.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

import torch
from transformers import StaticCache

from . import tag_automaton
from .backbone import Backbone, positions_from_mask
from .latent import GaussianSoftTokens
from .mixture import normalised_full_mixture, soft_topk, topk_mixture
from .sampling import (STREAM_GAUSSIAN, STREAM_ROUTE, STREAM_TOKEN, filter_logits, gumbel_argmax,
                       logprobs_and_entropy, step_normals, step_uniforms)

CACHE_BUCKET = 64      # cache lengths are rounded up to a multiple of this (docs/rollout-engines.md)
RECOMPILE_LIMIT = 64   # graphs of decode_step before dynamo fails (its default, 8, then runs eagerly)
# What torch.compile lowers the traced step with: inductor (the default), or a backend named by the environment
# variable TARPO_COMPILE_BACKEND, e.g. "aot_eager": the same fullgraph trace and functionalisation, run without
# code generation (no C++/Triton build). The test suite runs most compiled rollouts that way (tests/conftest.py).
COMPILE_BACKEND_VARIABLE = "TARPO_COMPILE_BACKEND"


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


def decode_step(backbone, router, gate, c: StepSettings, buf, rec, cache, mask, next_tag, hit_tag, eos):
    """One decode step for every row: reads ``h_t`` and the loop state from ``buf``, writes
    ``rec[:, t]``, then ``h_{t+1}`` and the next state back into ``buf``; returns nothing.

    ``buf``: ``hidden`` [B, d], ``t`` (0-d long), ``pos`` [B] next position ids, ``tag`` [B]
    automaton states, ``thinking`` / ``alive`` / ``ended`` [B] bool, ``keys`` [B] the rows' noise
    keys. The decisions are those of the eager engine (:func:`tarpo.rollout._decode`), computed
    densely for all rows.
    """
    state, keys, hidden = buf, buf["keys"], buf["hidden"]
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
    # the next state, written in place (ended before alive: it reads the old alive)
    buf["ended"].copy_(state["ended"] | (alive & is_eos))
    buf["alive"].copy_(alive & ~is_eos)
    buf["thinking"].copy_(thinking)
    buf["tag"].copy_(tag)
    buf["pos"].add_(1)
    buf["t"].add_(1)
    buf["hidden"].copy_(out.last_hidden_state[:, -1])


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


_COMPILED: dict[tuple[str, str], object] = {}


def compile_backend() -> str:
    """The backend the step is compiled with: $TARPO_COMPILE_BACKEND, else inductor."""
    return os.environ.get(COMPILE_BACKEND_VARIABLE) or "inductor"


def compiled_step(device: torch.device):
    """``decode_step`` under ``torch.compile(fullgraph=True)`` (inductor, or :func:`compile_backend`);
    on CUDA the loop replays it as a captured graph (:class:`GraphedStep`)."""
    key = (torch.device(device).type, compile_backend())
    if key not in _COMPILED:
        # One graph per setting and shape; past dynamo's default of 8 recompiles a function would
        # quietly run eagerly: allow more, and fail loudly instead.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        _COMPILED[key] = torch.compile(decode_step, fullgraph=True, dynamic=False, backend=key[1])
    return _COMPILED[key]


class GraphedStep:
    """One decode step as a CUDA graph: call 1 runs the compiled step (compiling it, and warming
    up on a side stream), call 2 captures it and replays the capture, every later call replays.

    Capturing is sound because the step reads and writes only the rollout's static buffers,
    which outlive the graph; capturing does not run the kernels, hence the replay right after.
    The graph and its memory pool go with this object, at the end of the rollout.
    """

    def __init__(self, call):
        self.call, self.graph, self.warm = call, None, False

    def __call__(self) -> None:
        if not self.warm:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.call()
            torch.cuda.current_stream().wait_stream(side)
            self.warm = True
            return
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.call()
        self.graph.replay()


def step_runner(call, device: torch.device):
    """What runs one step: the compiled call itself, or on CUDA its captured graph."""
    return GraphedStep(call) if torch.device(device).type == "cuda" else call


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
    """The static buffers of one rollout: cache, mask, loop state, records (see the module doc)."""

    def __init__(self, backbone: Backbone, batch: int, new_tokens: int, cache_len: int, k: int, full_mix: bool,
                 pad_token_id: int, device):
        from .rollout import new_records

        B, z = batch, dict(device=device)
        self.cache = StaticCache(config=backbone.config, max_cache_len=cache_len)
        self.rec = new_records(B, new_tokens, k, backbone.embed_weight.shape[1] if full_mix else 0, pad_token_id,
                               device)
        self.mask = torch.ones(B, cache_len, dtype=torch.long, **z)
        self.buf = dict(hidden=torch.zeros(B, backbone.config.hidden_size, dtype=backbone.embed_weight.dtype, **z),
                        t=torch.zeros((), dtype=torch.long, **z), pos=torch.zeros(B, dtype=torch.long, **z),
                        tag=torch.zeros(B, dtype=torch.long, **z), thinking=torch.ones(B, dtype=torch.bool, **z),
                        alive=torch.ones(B, dtype=torch.bool, **z), ended=torch.zeros(B, dtype=torch.bool, **z),
                        keys=torch.zeros(B, dtype=torch.long, **z))


def cache_length(prompt_len: int, new_tokens: int, prompt_budget: int | None = None) -> int:
    """Positions of the rollout's cache: the prompt budget (else this prompt) + new tokens, rounded
    up to a multiple of :data:`CACHE_BUCKET`.

        >>> cache_length(37, 100), cache_length(37, 100, prompt_budget=1024)
        (192, 1152)
    """
    return -(-(max(prompt_len, prompt_budget or 0) + new_tokens) // CACHE_BUCKET) * CACHE_BUCKET


def check_backbone(backbone) -> None:
    from .rollout import decodes_on_its_own_path

    if decodes_on_its_own_path(backbone):
        raise ValueError(f"engine='compiled' feeds inputs_embeds to the transformers decoder with a StaticCache; "
                         f"{type(backbone).__name__} decodes through its own path (BACKEND=unsloth): use "
                         "engine='eager' with it")


def check_fits(spec, prompt_ids) -> int:
    """The batch the engine decodes (``spec.batch_size`` or this one); a prompt or a batch larger
    than the run's shape is refused, naming the setting."""
    B, P = prompt_ids.shape
    if spec.max_prompt_length is not None and P > spec.max_prompt_length:
        raise ValueError(f"prompts of {P} tokens exceed max_prompt_length={spec.max_prompt_length}, the prompt "
                         "budget the compiled engine's cache was sized for")
    if spec.batch_size is not None and B > spec.batch_size:
        raise ValueError(f"a batch of {B} rows exceeds batch_size={spec.batch_size}, the compiled engine's batch")
    return spec.batch_size or B


@torch.no_grad()
def compiled_generate(backbone, router, prompt_ids, prompt_mask, spec, piece, eos_token_ids, pad_token_id,
                      keys: torch.Tensor, latent, gaussian: bool, gate, full_mix: bool, lockstep=None):
    """:func:`tarpo.rollout.hybrid_generate` with ``engine="compiled"`` (arguments checked and the
    routing's latent settings resolved there); ``keys``: the rows' noise keys
    (:func:`tarpo.sampling.row_keys`)."""
    from .rollout import DONE_CHECK_EVERY, Rollout, steps_that_ran

    check_backbone(backbone)
    device = prompt_ids.device
    rows, P = prompt_ids.shape
    B = check_fits(spec, prompt_ids)
    T, E = spec.max_new_tokens, backbone.embed_weight
    vocab = backbone.lm_head.weight.shape[0]
    engine = StaticDecoder(backbone, B, T, cache_length(P, T, spec.max_prompt_length), spec.soft_top_k, full_mix,
                           pad_token_id, device)
    if B > rows:  # rows that pad the batch to the run's shape: a copy of row 0 that never runs
        fill = B - rows
        prompt_ids = torch.cat([prompt_ids, prompt_ids[:1].expand(fill, -1)])
        prompt_mask = torch.cat([prompt_mask, prompt_mask[:1].expand(fill, -1)])
        keys = torch.cat([keys, keys[:1].expand(fill)])
        engine.buf["alive"][rows:] = False
        engine.buf["thinking"][rows:] = False
    engine.mask[:, :P] = prompt_mask
    engine.buf["keys"].copy_(keys)
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
        engine.buf["hidden"].copy_(prefill.last_hidden_state[:, -1])
        engine.buf["pos"].copy_(pos[:, -1] + 1)
        del prefill
        step = compiled_step(device)
        run = step_runner(lambda: step(backbone, router, gate, settings, engine.buf, engine.rec, engine.cache,
                                       engine.mask, next_tag, hit_tag, eos), device)
        flag = _LateFlag()
        for t in range(T):
            run()
            if (t + 1) % DONE_CHECK_EVERY:
                continue
            if lockstep is not None:  # sharded model: every rank steps until no rank has a running row
                if not lockstep(bool(engine.buf["alive"].any())):
                    break
            elif flag.read_then_post(engine.buf["alive"].any()) is False:
                break

    steps = steps_that_ran(engine.rec["completion_mask"][:rows])
    rec = {name: buf[:rows, :steps].clone() for name, buf in engine.rec.items()}
    ended = engine.buf["ended"][:rows].clone()
    del run, engine  # the cache, buffers and captured graph go now: the training forward needs the memory
    return Rollout(prompt_ids=prompt_ids[:rows], prompt_mask=prompt_mask[:rows], ended_with_eos=ended, **rec)
