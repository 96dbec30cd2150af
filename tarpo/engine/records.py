"""What a rollout records, in both engines (docs/algorithm.md §1).

Each generated step ``t`` of row ``i`` writes one entry of every ``[B, T]`` buffer of
:func:`new_records`: the token ``v_t``, whether the step exists, the router's action and whether a
decision was made, the soft input's top-k ids and weights (or its full mixture), rho(soft|h_t), the
entropy and the token's log-prob at sampling time. :class:`Rollout` holds them, cut to the steps
that ran; the trainer rebuilds every input of the training forward from them
(:func:`tarpo.engine.mixture.build_inputs_embeds`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

DONE_CHECK_EVERY = 16  # steps between "is any row still running?" checks of the compiled engine and of lockstep


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


ROLLOUT_FIELDS = tuple(f.name for f in fields(Rollout))  # its records, in order (the trainer's batch keys)
SOFT_RECORDS = ("soft_ids", "soft_weights", "soft_inputs")  # what it records of its soft steps (the soft inputs')


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


def padded(rollout: Rollout, multiple: int | None, pad_token_id: int) -> Rollout:
    """``rollout`` with its prompt padded on the left and its steps on the right to multiples of ``multiple`` (TRL's
    ``pad_to_multiple_of``; None: as it is), as a prompt's padding and a step that never ran leave them (pad tokens,
    False, 0: :func:`new_records`). The training forward then runs those lengths; masked, they change no score.

    >>> r = padded(Rollout(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool),
    ...     *(torch.ones(1, 5, dtype=d) for d in (torch.long, torch.bool, torch.bool, torch.bool)),
    ...     torch.zeros(1, 5, 2, dtype=torch.long), torch.zeros(1, 5, 2), *(torch.zeros(1, 5) for _ in range(3)),
    ...     torch.zeros(1, 5, 0), torch.ones(1, dtype=torch.bool)), 4, pad_token_id=9)
    >>> r.prompt_ids.tolist(), r.prompt_mask.tolist(), r.token_ids.tolist(), r.soft_ids.shape
    ([[9, 1, 1, 1]], [[False, True, True, True]], [[1, 1, 1, 1, 1, 9, 9, 9]], torch.Size([1, 8, 2]))
    """
    if not multiple:
        return rollout
    P, T = rollout.prompt_ids.shape[1], rollout.token_ids.shape[1]
    left, right = -P % multiple, -T % multiple
    out = {}
    for f in fields(Rollout):
        value = getattr(rollout, f.name)
        if f.name in ("prompt_ids", "prompt_mask"):
            fill = pad_token_id if f.name == "prompt_ids" else 0
            value = torch.cat([value.new_full((value.shape[0], left), fill), value], 1)
        elif value.dim() >= 2:  # [B, T, ...]: the steps
            fill = pad_token_id if f.name == "token_ids" else 0
            value = torch.cat([value, value.new_full((value.shape[0], right, *value.shape[2:]), fill)], 1)
        out[f.name] = value
    return Rollout(**out)


def steps_that_ran(completion_mask: torch.Tensor) -> int:
    """The steps up to the last one some row ran (at least 1): where an engine that kept stepping
    for finished rows (fixed batch, lockstep) cuts its records."""
    ran = completion_mask.any(0)
    return int(ran.nonzero().max()) + 1 if bool(ran.any()) else 1
