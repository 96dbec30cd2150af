"""The hybrid decode loop of docs/algorithm.md §1: one batched forward per step, KV cache reused.

At step t every live row samples a token ``v_t ~ pi(.|s_t)``. While a row is thinking,
a routing rule picks ``d_t``: hard feeds ``E(v_t)`` next, soft feeds the top-k mixture
(:func:`tarpo.mixture.build_inputs_embeds`, the same function the trainer uses). Once
the answer tag has been emitted, or at EOS, inputs are hard and no decision is made.

Which steps carry a router decision: a step's decision builds the *next* input, so it
is recorded exactly when a next input exists and the row is still thinking after
``v_t``: not at the step that completes the tag, not at EOS, not at the last allowed
step. ``Rollout.decided`` marks those steps; they are the thinking steps of the
objective (L_act, the action KL and delta_t).

The baselines of docs/algorithm.md §3 are routings of the same loop: ``hrpo`` and ``soft_tokens`` go
soft at every thinking step and change what a soft step feeds (``latent``: HRPO's gate,
or Soft Tokens' noisy full mixture); a full-vocabulary mixture (Soft Tokens', and HRPO's
own ``(p · E) / ‖p‖₂``) is recorded in ``soft_inputs``. ``entropy`` routing thresholds the
entropy of ``softmax(z_t / entropy_temperature)``; by default ``entropy_temperature`` = 1,
the model's own token distribution, whatever the sampling temperature.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

import torch
from transformers import DynamicCache

from .backbone import Backbone, positions_from_mask
from .config import ENGINES, ROUTING_MODES
from .mixture import build_inputs_embeds, normalised_full_mixture, soft_topk
from .sampling import (STREAM_GAUSSIAN, STREAM_ROUTE, STREAM_TOKEN, filter_logits, gumbel_argmax,
                       logprobs_and_entropy, row_keys, sample_tokens, step_normals, step_uniforms)
from .tagging import TagTracker


DONE_CHECK_EVERY = 16  # steps between "is any row still running?" checks of the compiled engine and of lockstep


@dataclass
class RolloutSpec:
    """Decode settings; :meth:`from_config` reads them from a :class:`TarpoConfig`."""

    max_new_tokens: int
    temperature: float = 0.5
    top_k: int = 0
    top_p: float = 1.0
    soft_top_k: int = 30
    routing: str = "learned"
    entropy_threshold: float = 0.5
    entropy_temperature: float = 1.0  # routing ``entropy``: the entropy of softmax(z_t / this) is thresholded
    router_greedy: bool = False
    greedy: bool = False  # argmax tokens (evaluation's greedy accuracy)
    answer_tag: str = "####"
    compact_finished_rows: bool = True  # eager engine only; the compiled one keeps a fixed batch
    # compiled engine: the run's shape, so that it compiles once per run (docs/rollout-engines.md)
    max_prompt_length: int | None = None  # the prompt budget its cache is sized for (None: this batch's prompts)
    batch_size: int | None = None         # rows it decodes; a smaller batch is padded (None: this batch's rows)
    engine: str = "eager"  # "eager" (the reference, any backbone), "compiled" (tarpo.static_decode) or "auto"

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(f"RolloutSpec.engine={self.engine!r}: must be one of {ENGINES}")
        if self.routing not in ROUTING_MODES:
            raise ValueError(f"RolloutSpec.routing={self.routing!r}: must be one of {ROUTING_MODES}")
        if self.entropy_temperature <= 0:
            raise ValueError(f"RolloutSpec.entropy_temperature={self.entropy_temperature!r}: must be > 0")

    @classmethod
    def from_config(cls, config, **overrides) -> "RolloutSpec":
        names = {f.name for f in fields(cls)} - {"max_new_tokens", "greedy", "engine", "batch_size"}
        kwargs = {n: getattr(config, n) for n in names}
        kwargs["max_new_tokens"] = config.max_completion_length
        kwargs["engine"] = config.rollout_engine
        kwargs.update(overrides)
        return cls(**kwargs)


@dataclass
class Rollout:
    """Everything a batch of trajectories recorded; [B, T] tensors unless noted."""

    prompt_ids: torch.Tensor          # [B, P], left-padded
    prompt_mask: torch.Tensor         # [B, P]
    token_ids: torch.Tensor           # v_t; pad after the end
    completion_mask: torch.Tensor     # bool: step exists (up to and including EOS)
    is_soft: torch.Tensor             # bool: d_t = soft (the next input was a mixture)
    decided: torch.Tensor             # bool: a router decision was made (thinking step)
    soft_ids: torch.Tensor            # [B, T, k]; valid where is_soft
    soft_weights: torch.Tensor        # [B, T, k] fp32; valid where is_soft
    p_soft: torch.Tensor              # fp32 rho(soft|h_t) where decided under learned routing, else 0
    entropy: torch.Tensor             # fp32 entropy of softmax(z_t / T_s), nats
    logp: torch.Tensor                # fp32 log softmax(z_t / T_s)[v_t] at sampling time
    soft_inputs: torch.Tensor         # [B, T, d] fp32 full mixtures of soft steps (Soft Tokens' noisy one,
                                      # HRPO's (p.E)/|p|), else [B, T, 0]
    ended_with_eos: torch.Tensor      # [B] bool

    @property
    def units(self) -> torch.Tensor:
        """Generated units per row, hard + soft (T_i of docs/algorithm.md §2)."""
        return self.completion_mask.sum(-1)

    @property
    def hard_tokens(self) -> torch.Tensor:
        return (self.completion_mask & ~self.is_soft).sum(-1)

    def select(self, index) -> "Rollout":
        return Rollout(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def new_records(batch: int, steps: int, k: int, soft_input_dim: int, pad_token_id: int, device) -> dict:
    """The ``[B, T]`` record buffers of a rollout (both engines), as a step that never ran leaves
    them: pad tokens, False, 0. ``soft_input_dim``: d where soft steps feed a recorded full
    mixture (HRPO's, Soft Tokens'), else 0."""
    B, T, z = batch, steps, dict(device=device)
    return dict(
        token_ids=torch.full((B, T), pad_token_id, dtype=torch.long, **z),
        completion_mask=torch.zeros(B, T, dtype=torch.bool, **z),
        is_soft=torch.zeros(B, T, dtype=torch.bool, **z),
        decided=torch.zeros(B, T, dtype=torch.bool, **z),
        soft_ids=torch.zeros(B, T, k, dtype=torch.long, **z),
        soft_weights=torch.zeros(B, T, k, dtype=torch.float32, **z),
        p_soft=torch.zeros(B, T, dtype=torch.float32, **z),
        entropy=torch.zeros(B, T, dtype=torch.float32, **z),
        logp=torch.zeros(B, T, dtype=torch.float32, **z),
        soft_inputs=torch.zeros(B, T, soft_input_dim, dtype=torch.float32, **z),
    )


def steps_that_ran(completion_mask: torch.Tensor) -> int:
    """The steps up to the last one some row ran (at least 1): where an engine that kept stepping
    for finished rows (fixed batch, lockstep) cuts its records."""
    ran = completion_mask.any(0)
    return int(ran.nonzero().max()) + 1 if bool(ran.any()) else 1


def decodes_on_its_own_path(backbone) -> bool:
    """Whether the backbone decodes through its own path (Unsloth's, :mod:`tarpo.hooks`) rather than
    by feeding ``inputs_embeds`` to the transformers decoder, which the compiled engine needs."""
    return type(backbone).hidden is not Backbone.hidden or getattr(backbone, "fixed_batch", False)


def resolve_engine(engine: str, backbone) -> str:
    """``"auto"`` -> ``"compiled"`` for a backbone on CUDA that feeds ``inputs_embeds`` to the
    transformers decoder; ``"eager"`` on the CPU, where compiling the step costs more than short
    runs save (docs/rollout-engines.md), and for a backbone with its own decode path."""
    if engine != "auto":
        return engine
    on_cuda = backbone.embed_weight.device.type == "cuda"
    return "compiled" if on_cuda and not decodes_on_its_own_path(backbone) else "eager"


def engine_for_backend(engine: str, backend: str, setting: str = "rollout_engine", cuda: bool | None = None) -> str:
    """The engine a run will use, known before the model loads (``backend``: ``hf`` or ``unsloth``,
    as :func:`tarpo.modeling.resolve_backend` returns; ``cuda``: whether it runs on a GPU, default:
    whether this machine has one); a compiled engine on Unsloth is refused, naming ``setting``.

        >>> [engine_for_backend("auto", b, cuda=True) for b in ("hf", "unsloth")], engine_for_backend("auto", "hf", cuda=False)
        (['compiled', 'eager'], 'eager')
    """
    if engine not in ENGINES:
        raise ValueError(f"{setting}={engine!r}: must be one of {', '.join(ENGINES)}")
    if backend == "unsloth" and engine == "compiled":
        raise ValueError(f"{setting}=compiled runs the transformers decoder with a static cache; Unsloth replaces "
                         "that decoder process-wide: use the eager engine (Unsloth's decode path) or the hf backend")
    if engine != "auto":
        return engine
    if cuda is None:
        cuda = torch.cuda.is_available()
    return "compiled" if cuda and backend != "unsloth" else "eager"


def _route(spec, router, hidden, entropy, decide, generator, uniforms=None):
    """d_t (bool, True = soft) and rho(soft|h_t) for the rows in ``decide``; ``entropy`` is the
    routing entropy (at ``spec.entropy_temperature``); ``uniforms``: the step's pre-drawn router
    noise (else ``generator`` draws)."""
    p_soft = torch.zeros_like(entropy)
    if spec.routing == "hard":
        return torch.zeros_like(decide), p_soft
    if spec.routing in ("soft", "hrpo", "soft_tokens"):
        return decide.clone(), p_soft
    if spec.routing == "entropy":
        return decide & (entropy > spec.entropy_threshold), p_soft
    p_soft = router.log_probs(hidden)[:, 1].exp()
    if spec.router_greedy:
        soft = p_soft > 0.5
    else:
        if uniforms is None:
            uniforms = torch.rand(p_soft.shape, device=p_soft.device, generator=generator)
        soft = uniforms < p_soft
    return decide & soft, torch.where(decide, p_soft, torch.zeros_like(p_soft))


@torch.no_grad()
def hybrid_generate(
    backbone: Backbone,
    router,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    spec: RolloutSpec,
    piece,
    eos_token_ids,
    pad_token_id: int,
    generator: torch.Generator | None = None,
    latent=None,
    noise_seed: int | None = None,
    row_ids: torch.Tensor | None = None,
    lockstep=None,
) -> Rollout:
    """Decode a batch of left-padded prompts with per-step hard/soft inputs.

    ``spec.engine`` picks the engine: ``"eager"``, this module's loop, the reference;
    ``"compiled"``, :mod:`tarpo.static_decode` (the transformers backend only); ``"auto"``,
    compiled where the backbone feeds ``inputs_embeds`` to the transformers decoder, else eager
    (:func:`resolve_engine`).

    Args:
        backbone: the policy (:class:`Backbone`).
        router: a :class:`tarpo.router.Router`; needed only for ``learned`` routing.
        piece: token id -> text, drives the answer-tag tracker (:func:`tagging.token_piece_fn`).
        eos_token_ids: ids that end a row.
        generator: optional RNG; ``None`` uses torch's global stream like ``generate``.
        noise_seed: draw every step's randomness as keyed noise (:func:`tarpo.sampling.step_uniforms`)
            of this seed and each row's id: both engines then draw the same trajectory, and a row
            the same whatever batch or process decodes it. The compiled engine always draws this
            way; without ``noise_seed`` it takes its seed from ``generator`` (or torch's stream).
            The eager engine without it samples with ``torch.multinomial``, as ``generate`` does.
        row_ids: the rows' global ids for keyed noise ([B] long; default 0..B-1), e.g. offset by
            the rank's share of a batch split across processes.
        lockstep: for models sharded across processes (every rank must make the same decoder
            calls): a function ``any_rank(flag: bool) -> bool``; ranks then decode until no
            rank has a running row, finished rows riding along (:func:`tarpo.distributed.any_rank`).
        latent: :class:`tarpo.latent.HrpoGate` (routing ``hrpo``) or
            :class:`tarpo.latent.GaussianSoftTokens` (routing ``soft_tokens``).
    """
    if spec.routing == "learned" and router is None:
        raise ValueError("routing='learned' needs a router")
    if spec.routing in ("hrpo", "soft_tokens") and latent is None:
        raise ValueError(f"routing={spec.routing!r} needs its latent module (HRPO gate / Soft Tokens noise)")
    engine = resolve_engine(spec.engine, backbone)
    keys = None
    if engine == "compiled" or noise_seed is not None:
        if noise_seed is None:
            noise_seed = int(torch.randint(2 ** 62, (), generator=generator,
                                           device=generator.device if generator is not None else "cpu"))
        if row_ids is None:
            row_ids = torch.arange(prompt_ids.shape[0])
        keys = row_keys(noise_seed, row_ids.to(prompt_ids.device))
    gaussian = spec.routing == "soft_tokens"
    gate = latent if spec.routing == "hrpo" else None
    full_mix = gaussian or (gate is not None and gate.mixture == "full")  # soft steps feed a recorded full mixture
    if engine == "compiled":
        from .static_decode import compiled_generate
        return compiled_generate(backbone, router, prompt_ids, prompt_mask, spec, piece, eos_token_ids,
                                 pad_token_id, keys, latent, gaussian, gate, full_mix, lockstep)
    compact = spec.compact_finished_rows and not getattr(backbone, "fixed_batch", False) and lockstep is None
    cache = DynamicCache(config=backbone.config)
    try:
        with backbone.decoding(), _grouped_attention(backbone):
            return _decode(backbone, router, prompt_ids, prompt_mask, spec, piece, eos_token_ids, pad_token_id,
                           generator, latent, gaussian, gate, full_mix, compact, keys, lockstep, cache)
    finally:
        release_cache(cache)


def release_cache(cache: DynamicCache) -> None:
    """Drop the K/V tensors of a rollout's cache, so that none outlives the rollout, also when it
    ended in an error (whose traceback keeps the decode loop's frame, and the cache, alive)."""
    cache.layers.clear()


def _grouped_attention(backbone):
    """The eager engine's decode steps through :func:`tarpo.static_decode.grouped_decode_attention`
    where the model runs transformers' SDPA attention: with left padding that path copies K/V once
    per query head at every step (``repeat_kv``), the grouped one reads the cache as it is. Other
    attention implementations, and backbones with their own decode path (Unsloth's,
    ``tarpo.patches.grouped_decode``), are left as they are (docs/rollout-engines.md)."""
    from .static_decode import grouped_decode_attention_on

    if not getattr(backbone, "transformers_decode", True) or backbone.config._attn_implementation != "sdpa":
        return contextlib.nullcontext()
    return grouped_decode_attention_on(backbone.config)


def _decode(backbone, router, prompt_ids, prompt_mask, spec, piece, eos_token_ids, pad_token_id, generator,
            latent, gaussian, gate, full_mix, compact, keys, lockstep, cache) -> Rollout:
    device = prompt_ids.device
    B, T, k = prompt_ids.shape[0], spec.max_new_tokens, spec.soft_top_k
    E = backbone.embed_weight
    eos = torch.as_tensor(list(eos_token_ids), device=device)
    rec = new_records(B, T, k, E.shape[1] if full_mix else 0, pad_token_id, device)
    ended_with_eos = torch.zeros(B, dtype=torch.bool, device=device)
    tracker = TagTracker(piece, spec.answer_tag, B)

    # Active sub-batch: `rows` maps its positions to original rows; `alive` is False for
    # rows that ended but were kept (compaction off), which are then ignored.
    rows = torch.arange(B, device=device)
    alive = torch.ones(B, dtype=torch.bool, device=device)
    mask = prompt_mask.long()
    pos = positions_from_mask(mask)
    hidden = backbone.hidden(E[prompt_ids], mask, pos, cache, token_ids=prompt_ids)[:, -1]
    next_pos = pos[:, -1] + 1

    steps = 0
    for t in range(T):
        steps = t + 1
        logits = backbone.logits(hidden).float()
        filtered = filter_logits(logits, spec.temperature, spec.top_k, spec.top_p)
        key = keys[rows] if keys is not None else None
        if key is not None and not spec.greedy:
            tokens = gumbel_argmax(filtered, step_uniforms(key, t, STREAM_TOKEN, filtered.shape[-1]))
        else:
            tokens = sample_tokens(filtered, spec.greedy, generator)
        scaled = logits / spec.temperature
        logp_all, entropy = logprobs_and_entropy(scaled)
        route_entropy = entropy
        if spec.routing == "entropy" and spec.entropy_temperature != spec.temperature:
            route_entropy = logprobs_and_entropy(logits / spec.entropy_temperature)[1]

        live_rows = rows[alive]
        live_tokens = tokens[alive]
        tracker.update(live_rows.tolist(), live_tokens.tolist())
        thinking = torch.tensor([tracker.thinking[r] for r in rows.tolist()], device=device)
        is_eos = torch.isin(tokens, eos)
        decide = alive & thinking & ~is_eos & (t < T - 1)
        soft, p_soft = _route(spec, router, hidden, route_entropy, decide, generator,
                              step_uniforms(key, t, STREAM_ROUTE, 1)[:, 0] if key is not None else None)

        rec["token_ids"][live_rows, t] = live_tokens
        rec["completion_mask"][live_rows, t] = True
        rec["is_soft"][rows, t] = soft
        rec["decided"][rows, t] = decide
        rec["p_soft"][rows, t] = p_soft
        rec["entropy"][live_rows, t] = entropy[alive]
        rec["logp"][live_rows, t] = logp_all.gather(-1, tokens[:, None]).squeeze(-1)[alive]
        soft_ids = soft_w = mixed = None
        if soft.any() and gaussian:
            mixed = latent.sample(scaled[soft], E, generator,
                                  step_normals(key[soft], t, STREAM_GAUSSIAN, E.shape[1]) if key is not None else None)
            rec["soft_inputs"][rows[soft], t] = mixed
        elif soft.any() and full_mix:  # HRPO: p is the distribution v_t was drawn from
            mixed = normalised_full_mixture(filtered[soft], E)
            rec["soft_inputs"][rows[soft], t] = mixed
        elif soft.any():
            soft_ids, soft_w = soft_topk(scaled[soft], k)
            rec["soft_ids"][rows[soft], t] = soft_ids
            rec["soft_weights"][rows[soft], t] = soft_w

        ended = alive & is_eos
        ended_with_eos[rows[ended]] = True
        alive = alive & ~is_eos
        if t == T - 1:
            break
        if lockstep is None and not alive.any():
            break
        if lockstep is not None and (t + 1) % DONE_CHECK_EVERY == 0 and not lockstep(bool(alive.any())):
            break

        # Next inputs: E(v_t) for hard rows, the mixture for soft rows (one shared function).
        full_ids = torch.zeros(tokens.shape[0], k, dtype=torch.long, device=device)
        full_w = torch.zeros(tokens.shape[0], k, dtype=torch.float32, device=device)
        if soft_ids is not None:
            full_ids[soft], full_w[soft] = soft_ids, soft_w
        full_u = None
        if full_mix:
            full_u = torch.zeros(tokens.shape[0], E.shape[1], dtype=torch.float32, device=device)
            if mixed is not None:
                full_u[soft] = mixed
        inputs = build_inputs_embeds(E, tokens, full_ids, full_w, soft, gate=gate, soft_inputs=full_u)
        if compact and not alive.all():
            keep = alive.nonzero(as_tuple=True)[0]
            cache.reorder_cache(keep)
            rows, alive, mask, next_pos, inputs = rows[keep], alive[keep], mask[keep], next_pos[keep], inputs[keep]
            tokens = tokens[keep]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        hidden = backbone.hidden(inputs[:, None], mask, next_pos[:, None], cache, token_ids=tokens[:, None])[:, -1]
        next_pos = next_pos + 1

    if lockstep is not None:  # steps run for other ranks' rows recorded nothing here
        steps = steps_that_ran(rec["completion_mask"])
    rec = {name: value[:, :steps] for name, value in rec.items()}
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, ended_with_eos=ended_with_eos, **rec)
