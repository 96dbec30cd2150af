"""The training forward of docs/algorithm.md §2: re-run prompt + completion with the recorded inputs.

Hard steps feed ``E(v_t)``, soft steps the mixture rebuilt from the recorded top-k ids
and fp32 weights by :func:`tarpo.engine.mixture.build_inputs_embeds` (the rollout's function),
left padding and the completion's tail are masked, and positions follow the mask. The
hidden state at position ``P - 1 + t`` predicts step ``t``.

Token log-probs use the sampling temperature ``T_s`` on the unfiltered logits (the
top-k/top-p filters, off by default, are not applied when scoring: a filtered policy
can give ``-inf`` to the reference). They are computed in chunks of positions, each
chunk recomputed in the backward pass, so neither a full [B, T, V] log-softmax nor
its autograd buffers ever exist at once.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from ..engine.backbone import Backbone, positions_from_mask
from ..engine.mixture import build_inputs_embeds
from ..engine.records import SOFT_RECORDS
from .divergences import k3, kl_divergence, two_class_kl


@dataclass
class StepScores:
    """Per-step quantities of the current policy (and reference), [B, T]."""

    logp_tok: torch.Tensor          # log pi_theta(v_t|s_t) at T_s
    logp_act: torch.Tensor          # log rho_theta(d_t|h_t) (0 where no router)
    p_hard: torch.Tensor            # rho_theta(hard|h_t) (1 where no router)
    kl_tok: torch.Tensor            # k3 or full KL to pi_ref (0 if no reference)
    kl_act: torch.Tensor            # KL(rho_theta || rho_ref) (0 if no reference / router)
    logp_soft_input: torch.Tensor | None = None  # log-density of a soft step's random input (the soft input's
    #                                          draw_log_density): Soft Tokens' log N(u_t; mean_theta, sigma^2 I), ...
    entropy: torch.Tensor | None = None      # entropy of pi_theta(.|s_t) at T_s, with its gradient (with_entropy)


def sequence_hidden(backbone: Backbone, rollout, soft_input) -> torch.Tensor:
    """Normed hidden states [B, T, d] that predict the T completion steps (``soft_input``: the rollout's)."""
    P = rollout.prompt_ids.shape[1]
    E = backbone.embed_weight
    completion = build_inputs_embeds(E, rollout.token_ids, rollout.is_soft, soft_input,
                                     {name: getattr(rollout, name) for name in SOFT_RECORDS})
    inputs = torch.cat([E[rollout.prompt_ids], completion], dim=1)
    if torch.is_grad_enabled() and not inputs.requires_grad:
        # Re-entrant gradient checkpointing (Unsloth forces it, process-wide) only backpropagates
        # into a checkpointed layer whose *inputs* require grad; LoRA weights inside would get none.
        # transformers and Unsloth arrange this with a hook on the embedding module, which this
        # forward never calls (it indexes E), so the rebuilt inputs are marked here.
        inputs.requires_grad_(True)
    mask = torch.cat([rollout.prompt_mask.long(), rollout.completion_mask.long()], dim=1)
    hidden = backbone.hidden(inputs, mask, positions_from_mask(mask))
    return hidden[:, P - 1:-1]


def _logp_chunk(head, hidden, targets, temperature, with_entropy=False):
    logits = head(hidden).float() / temperature
    if not with_entropy:  # gather before logsumexp: the backward then holds one fp32 [chunk, V] less at its peak
        return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)
    lse = logits.logsumexp(-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    # H = logsumexp(z) - sum_j p_j z_j, from the chunk's logits already in memory; with its gradient, which the
    # entropy bonus (entropy_coef) follows, as TRL's does (a use without one, the high-entropy mask, costs nothing)
    return logp, lse - (torch.softmax(logits, -1) * logits).sum(-1)


def _full_kl_chunk(head, hidden, ref_hidden, temperature, ref_head=None):
    logp = torch.log_softmax(head(hidden).float() / temperature, dim=-1)
    with torch.no_grad():
        ref_logp = torch.log_softmax((ref_head or head)(ref_hidden).float() / temperature, dim=-1)
    return kl_divergence(logp, ref_logp)


def _chunked(fn, chunk_size, *tensors, **kwargs):
    """``fn`` over row-chunks of ``tensors`` (checkpointed when grad flows), concatenated (each output of a
    tuple-valued ``fn`` on its own)."""
    outs = []
    for s in range(0, tensors[0].shape[0], chunk_size):
        part = [t[s:s + chunk_size] for t in tensors]
        if torch.is_grad_enabled() and part[0].requires_grad:
            outs.append(checkpoint(fn, *part, use_reentrant=False, **kwargs))
        else:
            outs.append(fn(*part, **kwargs))
    if outs and isinstance(outs[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*outs))
    return torch.cat(outs) if outs else tensors[0].new_zeros(0)


def soft_input_logprobs(backbone, hidden, rollout, mask, temperature, chunk_size, soft_input) -> torch.Tensor:
    """The log-density of each masked step's recorded soft-input draw under the current policy, 0 elsewhere; [B, T]
    fp32 (:meth:`tarpo.engine.soft_input.SoftInputBase.draw_log_density`: Soft Tokens' Gaussian, the Gumbel
    draw's Concrete density)."""
    names, E = soft_input.density_reads, backbone.embed_weight

    def chunk(h, *recorded):
        return soft_input.draw_log_density(backbone.logits(h).float(), E, dict(zip(names, recorded)), temperature)

    out = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    out[mask] = _chunked(chunk, chunk_size, hidden[mask], *(getattr(rollout, name)[mask] for name in names))
    return out


def token_logprobs(head, hidden, targets, mask, temperature, chunk_size, with_entropy=False):
    """log softmax(head(h)/T_s)[v_t] at masked positions, 0 elsewhere; [B, T] fp32. ``with_entropy``: also the
    entropy of softmax(head(h)/T_s) there (with its gradient), from the same chunks' logits: ``(logp, entropy)``."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    if not with_entropy:
        out[mask] = _chunked(lambda h, t: _logp_chunk(head, h, t, temperature), chunk_size,
                             hidden[mask], targets[mask])
        return out
    entropy = torch.zeros_like(out)
    values = _chunked(lambda h, t: _logp_chunk(head, h, t, temperature, True), chunk_size, hidden[mask], targets[mask])
    if isinstance(values, tuple):  # not when no step is in the mask (no chunk ran)
        out[mask], entropy[mask] = values
    return out, entropy


def full_token_kl(head, hidden, ref_hidden, mask, temperature, chunk_size, ref_head=None) -> torch.Tensor:
    """Exact KL(pi_theta || pi_ref) over the vocabulary per masked step; [B, T] fp32 (``ref_head``: the reference's
    head where it has one of its own)."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    out[mask] = _chunked(lambda h, r: _full_kl_chunk(head, h, r, temperature, ref_head), chunk_size,
                         hidden[mask], ref_hidden[mask])
    return out


@dataclass(frozen=True)
class ScoreSettings:
    """How :func:`score_rollout` scores a batch: built once per run from its config (:meth:`of`)."""

    temperature: float          # T_s, the sampling temperature the log-probs are taken at
    chunk_size: int             # completion positions per log-prob chunk (logprob_chunk_size)
    use_router: bool            # the router's log-probs and p_hard (the learned routings)
    with_reference: bool        # the reference's KL terms (beta != 0)
    token_kl: str = "k3"        # the token KL: "k3" of the sampled token, or "full" over the vocabulary
    with_entropy: bool = False  # the token distribution's entropy at every step (top_entropy_quantile, entropy_coef)

    @classmethod
    def of(cls, args) -> "ScoreSettings":
        return cls(temperature=args.temperature, chunk_size=args.logprob_chunk_size,
                   use_router=args.rule.router, with_reference=args.beta != 0.0, token_kl=args.token_kl,
                   with_entropy=args.top_entropy_quantile < 1.0 or args.entropy_coef != 0.0
                   or args.use_adaptive_entropy)


def score_rollout(backbone: Backbone, router, ref_router, rollout, settings: ScoreSettings,
                  soft_input, reference: Backbone | None = None) -> StepScores:
    """Policy (and reference) scores of a recorded batch under ``settings``; gradients flow to LoRA and router
    (and HRPO's gate, through the rebuilt inputs).

    The reference is the same backbone with its adapter disabled, fed the same inputs (``reference``: a backbone of
    its own, a frozen copy of the initial model, for full fine-tuning);
    ``ref_router`` (a frozen copy of the initial router) reads its hidden states.
    ``soft_input``: what the rollout's soft steps fed (:mod:`tarpo.engine.soft_input`), which rebuilds them; a random
    draw (Soft Tokens' noise, the Gumbel weights) adds its ``logp_soft_input`` at soft steps.
    ``settings.with_entropy``: the token distribution's entropy at every step too (``top_entropy_quantile``),
    computed in the log-prob chunks.
    """
    temperature, chunk_size, with_entropy = settings.temperature, settings.chunk_size, settings.with_entropy
    mask = rollout.completion_mask
    hidden = sequence_hidden(backbone, rollout, soft_input)
    logp_tok = token_logprobs(backbone.logits, hidden, rollout.token_ids, mask, temperature, chunk_size,
                              with_entropy)
    logp_tok, entropy = logp_tok if with_entropy else (logp_tok, None)
    zeros = torch.zeros_like(logp_tok)
    logp_act, p_hard, kl_tok, kl_act = zeros, torch.ones_like(logp_tok), zeros, zeros
    if settings.use_router:
        act_logp = router.log_probs(hidden)                               # [B, T, 2]
        logp_act = act_logp.gather(-1, rollout.is_soft.long()[..., None]).squeeze(-1)
        p_hard = act_logp[..., 0].exp()
    logp_soft_input = None
    if soft_input.kind.log_density:
        logp_soft_input = soft_input_logprobs(backbone, hidden, rollout, mask & rollout.is_soft, temperature,
                                              chunk_size, soft_input)
    if settings.with_reference:
        ref = reference if reference is not None else backbone
        with torch.no_grad(), (backbone.adapter_disabled() if reference is None else contextlib.nullcontext()):
            ref_hidden = sequence_hidden(ref, rollout, soft_input)
            if settings.token_kl == "k3":
                ref_logp = token_logprobs(ref.logits, ref_hidden, rollout.token_ids, mask, temperature, chunk_size)
        if settings.token_kl == "k3":
            kl_tok = torch.where(mask, k3(logp_tok, ref_logp), zeros)
        else:
            kl_tok = full_token_kl(backbone.logits, hidden, ref_hidden, mask, temperature, chunk_size, ref.logits)
        if settings.use_router:
            kl_act = two_class_kl(act_logp, ref_router.log_probs(ref_hidden))
    return StepScores(logp_tok=logp_tok, logp_act=logp_act, p_hard=p_hard, kl_tok=kl_tok, kl_act=kl_act,
                      logp_soft_input=logp_soft_input, entropy=entropy)
