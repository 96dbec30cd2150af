"""The action head rho(.|h_t) = softmax((W_r h_t + b_r) / tau_a) of docs/algorithm.md §1.

``W_r`` is [2, d] (row 0 = hard, row 1 = soft), kept in float32 whatever the backbone's
dtype; it reads the normed final hidden state. It is saved beside the LoRA adapter as
``router.safetensors`` + ``router_config.json``.
"""

from __future__ import annotations

import copy
import json
import os

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..config import default
from .precision import full_precision

ROUTER_WEIGHTS = "router.safetensors"
ROUTER_CONFIG = "router_config.json"


class Router(nn.Module):
    def __init__(self, hidden_size: int, bias=None, init_std: float | None = None, temperature: float | None = None):
        """``bias`` b0 = [hard, soft], ``init_std`` and ``temperature`` tau_a; None: TarpoConfig's
        ``action_bias``, ``router_init_std``, ``action_temperature``."""
        super().__init__()
        self.proj = nn.Linear(hidden_size, 2, dtype=torch.float32)
        self.temperature = float(default("action_temperature") if temperature is None else temperature)
        self.reset(default("action_bias") if bias is None else bias,
                   default("router_init_std") if init_std is None else init_std)

    @torch.no_grad()
    def reset(self, bias, init_std: float) -> None:
        """W_r ~ N(0, init_std) (zeros if 0), b_r = bias."""
        if init_std > 0:
            self.proj.weight.normal_(0.0, init_std)
        else:
            self.proj.weight.zero_()
        self.proj.bias.copy_(torch.as_tensor(bias, dtype=torch.float32))

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """log rho(.|h) [..., 2] in fp32 from hidden states of any dtype."""
        with full_precision(hidden):  # fp32 also under a rollout's or training forward's autocast
            return torch.log_softmax(self.proj(hidden.float()) / self.temperature, dim=-1)

    def frozen_copy(self) -> "Router":
        """The reference router rho_ref: a frozen copy of this router as it is now."""
        ref = copy.deepcopy(self)
        ref.requires_grad_(False)
        return ref

    def save(self, directory: str, state: dict | None = None) -> None:
        """``state``: the tensors to write, when this module's own are shards (tarpo.training.sharding)."""
        os.makedirs(directory, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in (state or self.state_dict()).items()},
                  os.path.join(directory, ROUTER_WEIGHTS))
        with open(os.path.join(directory, ROUTER_CONFIG), "w") as f:
            json.dump({"hidden_size": self.proj.in_features, "temperature": self.temperature}, f)

    @classmethod
    def load(cls, directory: str, device=None) -> "Router":
        with open(os.path.join(directory, ROUTER_CONFIG)) as f:
            cfg = json.load(f)
        router = cls(cfg["hidden_size"], temperature=cfg["temperature"])
        router.load_state_dict(load_file(os.path.join(directory, ROUTER_WEIGHTS)))
        return router.to(device) if device is not None else router
