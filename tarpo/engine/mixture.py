"""The one function that builds model inputs from a rollout's record (docs/algorithm.md §1).

A hard step feeds the sampled token's embedding ``E(v_t)``. A soft step feeds

    u_t = sum_i w_t[i] * E(K_t[i]),   K_t = top-k(z_t / T_s),   w_t = softmax(z_t / T_s)[K_t] renormalised

The baselines change only what a soft step feeds: HRPO passes a mixture through its gate
together with ``E(v_t)`` (:class:`tarpo.engine.soft_input.HrpoGate`); by default that mixture is HRPO's
full-vocabulary ``(p · E) / ‖p‖₂`` (:func:`normalised_full_mixture`), which the rollout records
in ``soft_inputs``; Soft Tokens feed the recorded noisy full mixture (``soft_inputs``) as it is.

Every top-k mixture, in either rollout engine and in training, is :func:`topk_mixture`: an
elementwise product summed over k, so a row's mixture is computed alone, the same whatever
the batch size and whichever other rows are soft, and every soft input is its soft input's ``feed``
of ``E(v_t)`` and that mixture (:mod:`tarpo.engine.soft_input`). The decode step (:mod:`tarpo.engine.step`,
both rollout engines) mixes every row and picks with ``torch.where``; the trainer calls
:func:`build_inputs_embeds` once per batch with ``[B, T]``-shaped records: the same ids and fp32 weights
(or the same recorded fp32 mixtures) give the same inputs. Rebuilding a top-k mixture gathers only k rows of
``E`` per soft step; a full-vocabulary mixture is computed once, at sampling time, and recorded (d floats per step).
"""

from __future__ import annotations

import torch


def soft_topk(scaled_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k ids of tempered logits and their softmax weights (fp32, sum to 1).

    Worked example, T_s already applied::

        >>> ids, w = soft_topk(torch.tensor([[0.0, 2.0, 1.0]]), 2)
        >>> ids.tolist(), [round(x, 4) for x in w[0].tolist()]
        ([[1, 2]], [0.7311, 0.2689])
    """
    values, ids = torch.topk(scaled_logits.float(), k, dim=-1)
    return ids, torch.softmax(values, dim=-1)


def topk_mixture(embedding: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``u = sum_i w[i] * E(K[i])`` in fp32 for ids and weights of shape [*S, k] -> [*S, d].

    An elementwise product, then a sum over k: each row is reduced on its own, so its value
    does not depend on the other rows (a batched matmul's blocking can).

        >>> topk_mixture(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[0, 1]]), torch.tensor([[0.25, 0.75]]))
        tensor([[0.2500, 1.5000]])
    """
    return (weights.float()[..., None] * embedding[ids].float()).sum(-2)


def normalised_full_mixture(filtered_scores: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
    """HRPO's mixture ``(p · E) / ‖p‖₂`` with ``p = softmax(filtered_scores)`` over the whole vocabulary,
    [n, V] -> [n, d] fp32. ``filtered_scores`` are the tempered, filtered logits the token was sampled
    from (:func:`tarpo.engine.sampling.filter_logits`). The product runs in ``E``'s dtype (no fp32 copy of
    ``E``), one [n, V] x [V, d] matmul, the cost of an lm_head.

        >>> E = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> normalised_full_mixture(torch.tensor([[0.0, 0.0]]), E)  # p = (1/2, 1/2), |p| = 1/sqrt(2)
        tensor([[0.7071, 0.7071]])
    """
    p = torch.softmax(filtered_scores.float(), dim=-1)
    mixed = (p.to(embedding.dtype) @ embedding).float()
    return mixed / p.norm(dim=-1, keepdim=True)


def build_inputs_embeds(embedding: torch.Tensor, token_ids: torch.Tensor, is_soft: torch.Tensor, soft_input,
                        recorded: dict, chunk_size: int = 1024) -> torch.Tensor:
    """Input embeddings for recorded steps of any leading shape ``S``.

    Args:
        embedding: the input embedding matrix ``E`` [V, d].
        token_ids: sampled ids ``v_t`` [*S] (placeholders at soft steps).
        is_soft: bool [*S], the router's action ``d_t == soft``.
        soft_input: what a soft step feeds (:mod:`tarpo.engine.soft_input`), the rollout's.
        recorded: the rollout's soft records, name -> [*S, ...] (``soft_ids``, ``soft_weights``, ``soft_inputs``);
            read only where soft.
        chunk_size: soft positions mixed at a time where a mixture is rebuilt from top-k records.

    Returns ``E[token_ids]`` with soft positions replaced by what the soft input feeds there, in ``E``'s dtype.
    """
    out = embedding[token_ids]
    where = is_soft.nonzero(as_tuple=True)
    if where[0].numel() == 0:
        return out
    mixed = soft_input.recorded_mixture(embedding, {name: r[where] for name, r in recorded.items()}, chunk_size)
    out[where] = soft_input.feed(out[where], mixed)
    return out
