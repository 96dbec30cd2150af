"""The compiled hybrid decode engine (``RolloutSpec.engine = "compiled"``): one static-shape step.

Both engines run the one decode step :func:`tarpo.engine.step.hybrid_step`. The eager engine
(:func:`tarpo.engine.rollout.hybrid_generate` with ``engine="eager"``) calls it on a ``DynamicCache``
that grows by ``torch.cat``, dropping finished rows and checking for the end at every step.
This one traces it, with the records' writes and the decoder call, into one function of fixed
shapes and no host sync (:func:`decode_step`), compiled once with ``torch.compile(fullgraph=True)``
and, on CUDA, replayed as one captured CUDA graph::

    hybrid_step (h_t -> token -> router -> next input) -> records written at step t -> decoder -> h_t+1

- **Static buffers, nothing fed back.** The step reads and writes only buffers allocated once
  per rollout (:class:`DecodeBuffers`): the cache, the mask, the hidden state ``h_t``, the
  loop state (step index, positions, tag automaton, thinking / alive / ended) and the records.
  It returns nothing, so no tensor it produced is ever an input of the next call: a captured
  CUDA graph replays the same kernels on the same addresses, and an output buffer that a
  graph runtime reuses between calls cannot corrupt the trajectory (tests poison them).
- **One shape per run.** The cache holds ``L`` positions, ``L`` = the run's prompt budget
  (``RolloutSpec.max_prompt_length``, else this batch's prompt length) + new tokens, rounded up
  to a multiple of 64 (:func:`tarpo.engine.functional_decoder.cache_length`); the batch is padded to
  ``RolloutSpec.batch_size`` with rows that never run. So training compiles one graph, and evaluation one per task.
  The prompt is prefilled eagerly once (each distinct prompt of the batch once); the attention mask is the
  prompt's mask followed by ones: causality hides positions not yet written.
- **Over the positions written, as CUDA graphs** (:mod:`tarpo.engine.step_replay`): a step attends over
  the slots written so far, rounded up (:func:`tarpo.engine.step_replay.attention_span`), and on CUDA each
  such span's step is captured as a CUDA graph and replayed.
- **Fixed batch.** Finished rows are not dropped; they ride along and write nothing (their
  records keep pad / False / 0, as the eager engine's). Every ``DONE_CHECK_EVERY`` steps
  the loop looks at a flag "some row is still running" copied without blocking at the
  previous check, and stops once it reads False.
- **Randomness** is keyed noise (:func:`tarpo.engine.sampling.step_uniforms`), a pure function of
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

import functools
import os

import torch

from . import decode_weights, functional_decoder, memory_plan, step_replay
from .backbone import distinct_prompts, positions_from_mask
from .records import DONE_CHECK_EVERY, Rollout, new_records, steps_that_ran
from .step import DecodeContext, hybrid_step, new_state

RECOMPILE_LIMIT = 64   # graphs of decode_step before dynamo fails (its default, 8, then runs eagerly)
# Each decoder layer a nested compile region (compiled once for all layers: functional_decoder._layer_region), by
# device, under inductor (compiled_step). On the CPU, where inductor's C++ build of every layer made a 30-layer
# model's compile 1.7x a 2-layer one's. Not yet on CUDA: no GPU has run it (docs/gpu/README.md names the check).
REGIONAL_COMPILE = {"cpu": True, "cuda": False}
# What torch.compile lowers the traced step with: inductor (the default), or a backend named by the environment
# variable TARPO_COMPILE_BACKEND, e.g. "aot_eager": the same fullgraph trace and functionalisation, run without
# code generation (no C++/Triton build). The test suite runs most compiled rollouts that way (tests/conftest.py).
COMPILE_BACKEND_VARIABLE = "TARPO_COMPILE_BACKEND"
# The settings the step compiles under, whatever the process set before: dynamo's and inductor's configuration is
# process-wide, and importing Unsloth sets suppress_errors (a failed compile then runs the step eagerly, and on
# CUDA that eager step would be captured as the graph) and inductor's experimental memory_planning, among others
# (unsloth_zoo/patching_utils.py, patch_torch_compile). In force only while the step is called, i.e. compiled.
STEP_SETTINGS = {
    "dynamo": dict(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True, suppress_errors=False),
    "inductor": dict(memory_planning=False),
}


def decode_step(ctx: DecodeContext, weights, buf, rec, cache, mask, regional: bool = False):
    """One decode step for every row: reads ``h_t`` and the loop state from ``buf``, writes
    ``rec[:, t]``, then ``h_{t+1}`` and the next state back into ``buf``; returns nothing.

    ``buf``: ``hidden`` [B, d], ``t`` (0-d long), ``slot`` (0-d long) the cache slot of the next input,
    ``pos`` [B] its position ids, the loop state of :func:`tarpo.engine.step.new_state` and ``keys`` [B] the
    rows' noise keys; ``rec``, ``cache``: the other buffers of :class:`DecodeBuffers`; ``mask``: the first ``n``
    slots of its mask (a view, ``n`` > ``slot``): the step attends over those ``n`` slots; ``regional``: each
    decoder layer a nested compile region (:data:`REGIONAL_COMPILE`). The decoder is
    :func:`tarpo.engine.functional_decoder.forward` over ``weights``, the model's own tensors; the context's
    backbone gives the embedding and the head.
    """
    step_index = buf["t"]
    out = hybrid_step(ctx, buf["hidden"], buf, step_index, buf["keys"])
    index = step_index.view(1)
    for name, value in out.records.items():
        rec[name].index_copy_(1, index, value.unsqueeze(1))
    slot, span = buf["slot"], mask.shape[1]
    functional_decoder.known_span(span, cache)  # unbacked (step_replay.SpanSteps): its bounds, for the trace
    hidden = functional_decoder.forward(weights, out.inputs[:, None], buf["pos"][:, None], cache, slot.view(1),
                                        functional_decoder.decode_mask(mask, slot), span, regional)
    for name, value in out.state.items():
        buf[name].copy_(value)
    buf["pos"].add_(1)
    buf["t"].add_(1)
    buf["slot"].add_(1)
    buf["hidden"].copy_(hidden[:, -1])


_COMPILED: dict[tuple[str, str], object] = {}


def compile_backend() -> str:
    """The backend the step is compiled with: $TARPO_COMPILE_BACKEND, else inductor."""
    return os.environ.get(COMPILE_BACKEND_VARIABLE) or "inductor"


def compiled_step(device: torch.device):
    """``decode_step`` under ``torch.compile(fullgraph=True)`` (inductor, or :func:`compile_backend`);
    on CUDA the loop replays it as a captured graph (:class:`tarpo.engine.step_replay.GraphedStep`).

    One graph per setting and shape; past dynamo's default of 8 recompiles a function would quietly
    run eagerly: the step allows :data:`RECOMPILE_LIMIT` and fails loudly beyond, and compiles under
    :data:`STEP_SETTINGS` whatever another library set (no ``suppress_errors``: a failed compile raises,
    naming the step). Those settings are dynamo's and inductor's process-wide configuration, so they are in
    force only while the step is called (when dynamo compiles or recompiles it); every other compiled
    function of the process keeps its own."""
    import torch._inductor.config as inductor_config

    key = (torch.device(device).type, compile_backend())
    if key not in _COMPILED:
        # regional where inductor generates code (what it saves is the code generation; another backend, e.g. the
        # tests' aot_eager, would only run each layer through the region's dispatch: 15% slower steps there)
        regional = REGIONAL_COMPILE.get(key[0], False) and key[1] == "inductor"

        def traced(ctx, weights, buf, rec, cache, mask):
            decode_step(ctx, weights, buf, rec, cache, mask, regional)
        compiled = torch.compile(traced, fullgraph=True, dynamic=False, backend=key[1])

        def step(*args):
            with torch._dynamo.config.patch(**STEP_SETTINGS["dynamo"]), \
                    inductor_config.patch(**STEP_SETTINGS["inductor"]):
                try:
                    return compiled(*args)
                except torch._dynamo.exc.TorchDynamoException as e:
                    raise RuntimeError(f"the rollout's decode step (tarpo.engine.static_decode.decode_step) failed "
                                       f"to compile with backend {key[1]!r}: {e}") from e
        _COMPILED[key] = step
    return _COMPILED[key]


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


class DecodeBuffers:
    """The static buffers of one rollout: cache, mask, loop state, records (see the module doc)."""

    def __init__(self, ctx: DecodeContext, weights, batch: int, cache_len: int, device):
        """For ``batch`` rows of the rollout ``ctx`` (its backbone, ``spec.max_new_tokens`` and ``soft_top_k``,
        ``mixture_width``, ``pad_token_id``) over a cache of ``cache_len`` positions."""
        B, z, backbone = batch, dict(device=device), ctx.backbone
        self.cache = functional_decoder.new_cache(weights, B, cache_len, backbone.embed_weight.dtype, device)
        self.rec = new_records(B, ctx.spec.max_new_tokens, ctx.spec.soft_top_k, ctx.mixture_width, ctx.pad_token_id,
                               device)
        # one spare column that no step reads: a span's view mask[:, :n] is then never contiguous, not even the whole
        # cache's, and one compiled graph serves every span (a contiguous first view was guarded on: a recompile)
        self.mask = torch.ones(B, cache_len + 1, dtype=torch.long, **z)[:, :cache_len]
        self.buf = dict(hidden=torch.zeros(B, backbone.config.hidden_size, dtype=backbone.embed_weight.dtype, **z),
                        t=torch.zeros((), dtype=torch.long, **z), slot=torch.zeros((), dtype=torch.long, **z),
                        pos=torch.zeros(B, dtype=torch.long, **z),
                        keys=torch.zeros(B, dtype=torch.long, **z), **new_state(B, device))


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


def _prefill(weights, embed, prompt_ids, prompt_mask, cache) -> torch.Tensor:
    """The prompts' last hidden states [B, d], the cache's first P slots written for every row. A prompt that occurs
    several times in the batch (a GRPO group, ``tarpo eval``'s ``--n`` samples of one question, the rows that pad the
    batch) is run once and its keys and values copied to each of its rows, when that at least quarters the rows run
    (the prompt cache held meanwhile then stays within the memory plan's figure of a forward of every row,
    docs/memory-plan.md): the
    numbers of a forward of every row up to the kernels' batch-size rounding, for a fraction of the prompt compute
    (as the eager engine's prefill, ``tarpo.engine.rollout._prefill``)."""
    B, P = prompt_ids.shape
    slots = torch.arange(P, device=prompt_ids.device)
    ids, mask, inverse = distinct_prompts(prompt_ids, prompt_mask)
    if 4 * ids.shape[0] > B:  # few copies: one forward of every row (no second cache, the plan's B rows)
        return functional_decoder.forward(weights, embed[prompt_ids], positions_from_mask(prompt_mask.long()), cache,
                                          slots, functional_decoder.prefill_mask(prompt_mask), P)[:, -1]
    once = functional_decoder.new_cache(weights, ids.shape[0], P, cache[0][0].dtype, ids.device)
    hidden = functional_decoder.forward(weights, embed[ids], positions_from_mask(mask), once, slots,
                                        functional_decoder.prefill_mask(mask), P)[:, -1]
    for (keys, values), (unique_keys, unique_values) in zip(cache, once):
        keys[:, :, :P].copy_(unique_keys[inverse])
        values[:, :, :P].copy_(unique_values[inverse])
    return hidden[inverse]


@torch.no_grad()
def compiled_generate(ctx: DecodeContext, prompt_ids, prompt_mask, keys: torch.Tensor, lockstep=None):
    """:func:`tarpo.engine.rollout.hybrid_generate` with ``engine="compiled"``, in the rollout's context
    ``ctx`` (``ctx.generator`` None); ``keys``: the rows' noise keys (:func:`tarpo.engine.sampling.row_keys`)."""
    device, spec, backbone = prompt_ids.device, ctx.spec, ctx.backbone
    rows, P = prompt_ids.shape
    B = check_fits(spec, prompt_ids)
    T, E = spec.max_new_tokens, backbone.embed_weight
    # the model's own tensors, whichever backend, and the copies the rollout decodes with (the LoRA merged in)
    # the rollout as the memory plan sees it, at the prompt budget (a first short batch chooses decode_merge="auto"
    # for the run's longest), and its cache's positions (memory_plan.cache_positions: cache_length's rule)
    run = memory_plan.Run(rows=B, prompt=max(P, spec.max_prompt_length or 0), completion=T,
                          soft_top_k=spec.soft_top_k, full_mix=ctx.mixture_width > 0, weight_bytes=E.element_size())
    length = memory_plan.cache_positions(run)
    level = decode_weights.merge_level(backbone.model, spec.decode_merge, run, device)
    weights = decode_weights.decoder_weights(backbone.model, level)
    engine = DecodeBuffers(ctx, weights, B, length, device)
    if B > rows:  # rows that pad the batch to the run's shape: a copy of row 0 that never runs
        fill = B - rows
        prompt_ids = torch.cat([prompt_ids, prompt_ids[:1].expand(fill, -1)])
        prompt_mask = torch.cat([prompt_mask, prompt_mask[:1].expand(fill, -1)])
        keys = torch.cat([keys, keys[:1].expand(fill)])
        engine.buf["alive"][rows:] = False
        engine.buf["thinking"][rows:] = False
    engine.mask[:, :P] = prompt_mask
    engine.buf["keys"].copy_(keys)

    pos = positions_from_mask(prompt_mask.long())
    engine.buf["hidden"].copy_(_prefill(weights, E, prompt_ids, prompt_mask, engine.cache))
    engine.buf["pos"].copy_(pos[:, -1] + 1)
    engine.buf["slot"].fill_(P)
    step = compiled_step(device)
    run = step_replay.step_runner(functools.partial(step, ctx, weights, engine.buf, engine.rec, engine.cache),
                                  engine.mask, device)
    flag = _LateFlag()
    L = engine.mask.shape[1]
    for t in range(T):
        run(step_replay.attention_span(P + t, L))
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
    del run, engine, weights  # the cache, buffers, weight copies and captured graph go now: training needs the memory
    return Rollout(prompt_ids=prompt_ids[:rows], prompt_mask=prompt_mask[:rows], ended_with_eos=ended, **rec)
