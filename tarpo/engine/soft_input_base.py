"""What every soft input does unless its class says otherwise (:class:`SoftInputBase`), how a class takes its row of
:data:`tarpo.algorithms.SOFT_INPUTS` (:func:`with_kind`) and the top-k records that TARPO's mixture, Gumbel's and
HRPO's ``top_k`` mixture share. The variants, and their registry (complete by construction), are
:mod:`tarpo.engine.soft_input` (and :mod:`tarpo.engine.hrpo_gate`); callers ask there."""

from __future__ import annotations

import json
import os

import torch

from ..algorithms import SOFT_INPUTS
from ..atomic_files import write_json_atomic
from .mixture import soft_topk, topk_mixture

def with_kind(cls):
    """``cls``, the code of the soft input ``cls.name``, with ``cls.kind`` its row of
    :data:`tarpo.algorithms.SOFT_INPUTS` (a name without a row fails here, at import)."""
    cls.kind = SOFT_INPUTS[cls.name]
    return cls


class SoftInputBase:
    """What every soft input does unless its class says otherwise. ``draw`` and ``recorded_mixture`` are the
    two each class writes; the rest default to a mixture fed as it is, with no parameters, no settings to save
    and no log-density."""

    name = ""
    kind = None           # its row of tarpo.algorithms.SOFT_INPUTS (set by @with_kind)
    weights_file = None   # the file its trained parameters are saved in beside the adapter (kind.trained)
    settings_file = None  # the file its settings are saved in beside the adapter (those :meth:`settings` returns)
    density_reads = ()    # the records draw_log_density reads (kind.log_density)

    @classmethod
    def for_run(cls, args, model) -> "SoftInputBase":
        """This soft input as a run's :class:`tarpo.config.TarpoConfig` ``args`` sets it up for ``model``."""
        return cls()

    @classmethod
    def full_mixture(cls, args) -> bool:
        """Does a soft step feed, and the rollout record (``Rollout.soft_inputs``), a ``d``-wide full-vocabulary
        mixture under the run's settings ``args``? The memory plan asks before the soft input exists."""
        return False

    @property
    def records_mixture(self) -> bool:
        """:meth:`full_mixture` of this soft input as built (the decode step asks)."""
        return False

    @classmethod
    def trained_elements(cls, hidden_size: int) -> int:
        """The fp32 parameters it trains beside the LoRA for a model of ``hidden_size`` (the memory plan's count)."""
        return 0

    def parameter_groups(self, args) -> list[dict]:
        """Its trained parameters' optimizer groups (``params``, ``lr``, ``weight_decay``) under the run's settings."""
        return []

    def settings(self) -> dict:
        """The constructor's arguments that :meth:`load` rebuilds it with (saved in :attr:`settings_file`)."""
        return {}

    def save(self, directory: str, state: dict | None = None) -> None:
        """Save what a reload needs into ``directory`` (an adapter or checkpoint folder): its settings; ``state``:
        its parameters, gathered whole where they are shards (tarpo.training.sharding)."""
        if self.settings_file is not None:
            write_json_atomic(os.path.join(directory, self.settings_file), self.settings())

    @classmethod
    def load(cls, directory: str | None, device=None) -> "SoftInputBase":
        """The soft input saved in ``directory`` by :meth:`save` (a stateless one needs nothing there)."""
        if cls.settings_file is None:
            return cls()
        path = os.path.join(directory or "", cls.settings_file)
        if not os.path.isfile(path):
            raise ValueError(f"{path}: not there; the {cls.name} soft input's settings are saved in it beside the "
                             "adapter (an adapter of an earlier tarpo lacks it: train the run again)")
        with open(path) as f:
            return cls(**json.load(f))

    def draw(self, embedding, scaled, filtered, k: int, noise) -> tuple[torch.Tensor, dict]:
        """Every row's fp32 soft mixture [B, d] at a decode step, and what the rollout records of it (record name ->
        [B, ...], kept where the step is soft). ``scaled``: z_t / T_s [B, V]; ``filtered``: the tempered, filtered
        scores ``v_t`` was drawn from; ``noise(stream, width, normal=False)``: [B, width] draws of the step."""
        raise NotImplementedError

    def recorded_mixture(self, embedding, recorded: dict, chunk_size: int) -> torch.Tensor:
        """The fp32 mixtures [n, d] of ``n`` recorded soft steps (``recorded``: the rollout's records there)."""
        raise NotImplementedError

    def feed(self, token_embedding: torch.Tensor, mixture: torch.Tensor) -> torch.Tensor:
        """What a soft step feeds, given ``E(v_t)`` and its fp32 mixture (any leading shape), in ``E``'s dtype.

            >>> SoftInputBase().feed(torch.zeros(1, 2, dtype=torch.bfloat16), torch.tensor([[0.5, 1.5]]))
            tensor([[0.5000, 1.5000]], dtype=torch.bfloat16)
        """
        return mixture.to(token_embedding.dtype)

    def draw_log_density(self, logits, embedding, recorded: dict, temperature: float) -> torch.Tensor:
        """log-density [n] of ``n`` recorded draws under the current policy's fp32 ``logits`` [n, V]."""
        raise TypeError(f"soft input {self.name!r} is not a random draw: it has no log-density")


def topk_records(embedding, scaled, k):
    """The top-k mixture of a decode step and its records: the k ids and their fp32 weights."""
    ids, weights = soft_topk(scaled, k)
    return topk_mixture(embedding, ids, weights), dict(soft_ids=ids, soft_weights=weights)


def recorded_topk(embedding, recorded, chunk_size):
    """The top-k mixtures of recorded ids and weights, ``chunk_size`` steps at a time (bounding the fp32 [n, k, d]
    gather: k = 30, d = 2048 is 250 MB a chunk of 1,024)."""
    ids, weights = recorded["soft_ids"], recorded["soft_weights"]
    return torch.cat([topk_mixture(embedding, ids[s:s + chunk_size], weights[s:s + chunk_size])
                      for s in range(0, ids.shape[0], chunk_size)])
