"""The rollout of docs/algorithm.md §1: :func:`hybrid_generate`, and its eager engine.

At step t every live row samples a token ``v_t ~ pi(.|s_t)``. While a row is thinking,
a routing rule picks ``d_t``: hard feeds ``E(v_t)`` next, soft feeds the top-k mixture
(:mod:`tarpo.engine.mixture`, the same functions the trainer uses). Once the answer tag has been
emitted, or at EOS, inputs are hard and no decision is made. The step itself is
:func:`tarpo.engine.step.hybrid_step`, shared by the two engines: the eager one here (one batched
forward per step on a dynamic KV cache, finished rows dropped) and the compiled one
(:mod:`tarpo.engine.static_decode`).

Which steps carry a router decision: a step's decision builds the *next* input, so it
is recorded exactly when a next input exists and the row is still thinking after
``v_t``: not at the step that completes the tag, not at EOS, not at the last allowed
step. ``Rollout.decided`` marks those steps; they are the thinking steps of the
objective (L_act, the action KL and delta_t).

The baselines of docs/algorithm.md §3 are routings of the same loop: ``hrpo`` and ``soft_tokens`` go
soft at every thinking step and change what a soft step feeds (their soft input, :mod:`tarpo.engine.soft_input`: HRPO's
gate, or Soft Tokens' noisy full mixture); a full-vocabulary mixture (Soft Tokens', and HRPO's
own ``(p · E) / ‖p‖₂``) is recorded in ``soft_inputs``. ``entropy`` routing thresholds the
entropy of ``softmax(z_t / entropy_temperature)``; by default ``entropy_temperature`` = 1,
the model's own token distribution, whatever the sampling temperature.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

import torch
from transformers import DynamicCache

from ..config import default
from ..engineering_fields import DECODE_MERGES
from ..method_fields import sampling_problem
from ..algorithms import ROUTINGS, Routing, routing_rule
from .backbone import distinct_prompts, positions_from_mask
from .engine_choice import check_engine, engine_for
from .grouped_attention import grouped_decode_attention_on
from .records import DONE_CHECK_EVERY, Rollout, new_records, steps_that_ran
from .sampling import row_keys
from .static_decode import compiled_generate
from .step import DecodeContext, Policy, hybrid_step, new_state

__all__ = ["RolloutSpec", "Rollout", "Policy", "hybrid_generate", "release_cache"]


@dataclass(frozen=True)
class RolloutSpec:
    """Decode settings, defaults those of :class:`tarpo.config.TarpoConfig`; :meth:`from_config`
    reads them from a config. Frozen: the decode step reads them as they are, from the rollout's
    :class:`tarpo.engine.step.DecodeContext` (the compiled engine's graph specialises on them)."""

    max_new_tokens: int
    temperature: float = default("temperature")
    top_k: int = default("top_k")
    top_p: float = default("top_p")
    min_p: float | None = default("min_p")  # TRL's: a token under min_p x the top one's probability is not drawn
    soft_top_k: int = default("soft_top_k")
    routing: str = default("routing")
    entropy_threshold: float = default("entropy_threshold")
    entropy_temperature: float = default("entropy_temperature")  # routing ``entropy``: entropy of softmax(z_t / this)
    entropy_soft_when: str = default("entropy_soft_when")  # routing ``entropy``: soft above ('high') or below ('low')
    router_greedy: bool = False
    greedy: bool = False  # argmax tokens (evaluation's greedy accuracy)
    answer_tag: str = default("answer_tag")
    compact_finished_rows: bool = True  # eager engine only; the compiled one keeps a fixed batch
    # compiled engine: the run's shape, so that it compiles once per run (docs/rollout-engines.md)
    max_prompt_length: int | None = None  # the prompt budget its cache is sized for (None: this batch's prompts)
    batch_size: int | None = None         # rows it decodes; a smaller batch is padded (None: this batch's rows)
    engine: str = "eager"  # "eager" (the reference, any backbone), "compiled" (tarpo.engine.static_decode) or "auto"
    decode_merge: str = default("decode_merge")  # compiled engine's decode weights (tarpo.engine.decode_weights)

    def __post_init__(self):
        check_engine(self.engine, "RolloutSpec.engine")
        if self.decode_merge not in DECODE_MERGES:
            raise ValueError(f"RolloutSpec.decode_merge={self.decode_merge!r}: must be one of "
                             f"{', '.join(DECODE_MERGES)}")
        routing_rule(self.routing, "RolloutSpec.routing")
        if (problem := sampling_problem(self)) is not None:  # the sampling settings' rule, TarpoConfig's
            name, why = problem
            raise ValueError(f"RolloutSpec.{name}={getattr(self, name)!r}: {why}")

    @property
    def rule(self) -> Routing:
        """The routing rule of ``routing`` (:data:`tarpo.algorithms.ROUTINGS`), as :attr:`TarpoConfig.rule`."""
        return ROUTINGS[self.routing]

    @classmethod
    def from_config(cls, config, **overrides) -> "RolloutSpec":
        names = {f.name for f in fields(cls)} - {"max_new_tokens", "greedy", "engine", "batch_size"}
        kwargs = {n: getattr(config, n) for n in names}
        kwargs["max_new_tokens"] = config.max_completion_length
        kwargs["engine"] = config.rollout_engine
        kwargs["min_p"] = (getattr(config, "generation_kwargs", None) or {}).get("min_p", config.min_p)  # TRL's way
        kwargs.update(overrides)
        return cls(**kwargs)


@torch.no_grad()
def hybrid_generate(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    spec: RolloutSpec,
    *,
    generator: torch.Generator | None = None,
    noise_seed: int | None = None,
    row_ids: torch.Tensor | None = None,
    lockstep=None,
) -> Rollout:
    """Decode a batch of left-padded prompts with per-step hard/soft inputs. What every step reads is
    gathered once into a :class:`tarpo.engine.step.DecodeContext` that the engines pass on.

    ``spec.engine`` picks the engine: ``"eager"``, this module's loop through the backend's own decode, the
    reference; ``"compiled"``, :mod:`tarpo.engine.static_decode` over the model's own tensors, any backend;
    ``"auto"``, compiled on a GPU, else eager (:func:`tarpo.engine.engine_choice.engine_for`).

    Args:
        policy: the backbone, its router and soft-input module, the token texts and end ids
            (:class:`tarpo.engine.step.Policy`).
        generator: optional RNG; ``None`` uses torch's global stream like ``generate``.
        noise_seed: draw every step's randomness as keyed noise (:func:`tarpo.engine.sampling.step_uniforms`)
            of this seed and each row's id: both engines then draw the same trajectory, and a row
            the same whatever batch or process decodes it. The compiled engine always draws this
            way; without ``noise_seed`` it takes its seed from ``generator`` (or torch's stream).
            The eager engine without it samples with ``torch.multinomial``, as ``generate`` does.
        row_ids: the rows' global ids for keyed noise ([B] long; default 0..B-1), e.g. offset by
            the rank's share of a batch split across processes.
        lockstep: for models sharded across processes (every rank must make the same decoder
            calls): a function ``any_rank(flag: bool) -> bool``, True when ``flag`` is on some rank (an
            all-reduce); ranks then decode until no rank has a running row, finished rows riding along.
    """
    backbone = policy.backbone
    engine = engine_for(spec.engine, backbone.embed_weight.device.type == "cuda")
    keyed = engine == "compiled" or noise_seed is not None  # else the steps draw from `generator`
    ctx = DecodeContext.build(spec, policy, prompt_ids.device, generator=None if keyed else generator)
    keys = None
    if keyed:
        if noise_seed is None:
            noise_seed = int(torch.randint(2 ** 62, (), generator=generator,
                                           device=generator.device if generator is not None else "cpu"))
        if row_ids is None:
            row_ids = torch.arange(prompt_ids.shape[0])
        keys = row_keys(noise_seed, row_ids.to(prompt_ids.device))
    if engine == "compiled":
        return compiled_generate(ctx, prompt_ids, prompt_mask, keys, lockstep)
    cache = DynamicCache(config=backbone.config)
    try:
        with backbone.decoding(), _grouped_attention(backbone):
            return _decode(ctx, prompt_ids, prompt_mask, keys, lockstep, cache)
    finally:
        release_cache(cache)


def release_cache(cache: DynamicCache) -> None:
    """Drop the K/V tensors of a rollout's cache, so that none outlives the rollout, also when it
    ended in an error (whose traceback keeps the decode loop's frame, and the cache, alive)."""
    cache.layers.clear()


def _grouped_attention(backbone):
    """The eager engine's decode steps through :func:`tarpo.engine.grouped_attention.grouped_decode_attention`
    where the model runs transformers' SDPA attention: with left padding that path copies K/V once
    per query head at every step (``repeat_kv``), the grouped one reads the cache as it is. Other
    attention implementations, and backbones with their own decode path (Unsloth's,
    ``tarpo.patches.grouped_decode``), are left as they are (docs/rollout-engines.md)."""
    if not getattr(backbone, "transformers_decode", True) or backbone.config._attn_implementation != "sdpa":
        return contextlib.nullcontext()
    return grouped_decode_attention_on(backbone.config)


def _decode(ctx: DecodeContext, prompt_ids, prompt_mask, keys, lockstep, cache) -> Rollout:
    """The eager engine: :func:`tarpo.engine.step.hybrid_step` on the rows still running, a dynamic cache.
    Finished rows are dropped at the end checks unless the spec, the backbone (``fixed_batch``) or
    ``lockstep`` keeps the batch whole."""
    device, spec, backbone = prompt_ids.device, ctx.spec, ctx.backbone
    B, T = prompt_ids.shape[0], spec.max_new_tokens
    compact = spec.compact_finished_rows and not getattr(backbone, "fixed_batch", False) and lockstep is None
    rec = new_records(B, T, spec.soft_top_k, ctx.mixture_width, ctx.pad_token_id, device)
    ended_with_eos = torch.zeros(B, dtype=torch.bool, device=device)

    # The running sub-batch: `rows` maps its positions to the batch's rows. Rows that ended ride along
    # (the step ignores them: state["alive"] False) until the next end check, which drops them when compacting.
    rows, state = torch.arange(B, device=device), new_state(B, device)
    mask = prompt_mask.long()
    pos = positions_from_mask(mask)
    hidden = _prefill(backbone, prompt_ids, mask, pos, cache)
    next_pos = pos[:, -1] + 1
    for t in range(T):
        out = hybrid_step(ctx, hidden, state, t, keys)
        for name, value in out.records.items():
            rec[name][rows, t] = value
        state, inputs, tokens = out.state, out.inputs, out.tokens
        ended_with_eos[rows] = state["ended"]
        if t == T - 1:
            break
        if (t + 1) % DONE_CHECK_EVERY == 0:  # the loop's one host sync, every DONE_CHECK_EVERY steps
            keep = _end_check(state["alive"], compact, lockstep)
            if keep is None:
                break
            if keep.shape[0] < rows.shape[0]:
                cache.reorder_cache(keep)
                rows, mask, next_pos, inputs, tokens = (rows[keep], mask[keep], next_pos[keep], inputs[keep],
                                                        tokens[keep])
                state = {name: value[keep] for name, value in state.items()}
                keys = keys[keep] if keys is not None else None
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        hidden = backbone.hidden(inputs[:, None], mask, next_pos[:, None], cache, token_ids=tokens[:, None])[:, -1]
        next_pos = next_pos + 1

    steps = steps_that_ran(rec["completion_mask"])  # rows that ended before the last check recorded nothing since
    rec = {name: value[:, :steps] for name, value in rec.items()}
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, ended_with_eos=ended_with_eos, **rec)


def _prefill(backbone, prompt_ids, mask, pos, cache):
    """The prompts' last hidden states [B, d], ``cache`` filled for every row. A prompt that occurs
    several times in the batch (a GRPO group, ``tarpo eval``'s ``--n`` samples of one question) is
    run through the model once and its cache rows copied: the same numbers as a forward of every row
    up to the kernels' batch-size rounding, for a fraction of the prompt compute. Backbones with their
    own decode path keep one forward of the whole batch."""
    E = backbone.embed_weight
    ids, umask, inverse = distinct_prompts(prompt_ids, mask)
    if ids.shape[0] == prompt_ids.shape[0] or not getattr(backbone, "transformers_decode", True):
        return backbone.hidden(E[prompt_ids], mask, pos, cache, token_ids=prompt_ids)[:, -1]
    hidden = backbone.hidden(E[ids], umask, positions_from_mask(umask), cache, token_ids=ids)[:, -1]
    cache.reorder_cache(inverse)
    return hidden[inverse]


def _end_check(alive, compact: bool, lockstep):
    """The eager loop's end check: None when it stops (no row runs; with ``lockstep``, on no rank), else
    the positions of the running sub-batch to keep (all of them unless ``compact``). It reads ``alive`` on
    the host: one sync, made every :data:`DONE_CHECK_EVERY` steps, never at the steps between."""
    if lockstep is not None:
        return None if not lockstep(bool(alive.any())) else _all(alive)
    if not compact:
        return _all(alive) if bool(alive.any()) else None
    keep = alive.nonzero(as_tuple=True)[0]
    return keep if keep.shape[0] else None


def _all(alive):
    return torch.arange(alive.shape[0], device=alive.device)
