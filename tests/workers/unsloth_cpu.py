"""Unsloth 2026.10.7's Python code on a CPU-only torch, for tests/test_unsloth_cpu.py.

With ``UNSLOTH_ALLOW_CPU=1`` Unsloth imports without a GPU, but three things stop its model
code from running here, and :func:`install` stands in for exactly those (test doubles, never
used outside the tests):

- device queries (``torch.cuda.get_device_capability`` and friends) answered with fixed values;
- Unsloth's per-device RoPE caches and decode scratch buffers, which it indexes by CUDA device
  and places on ``cuda:0``, get one slot on the CPU;
- its two Triton kernels on the prefill and training path, ``fast_rms_layernorm`` and
  ``fast_rope_embedding``, become the same arithmetic in eager torch.

Everything else that runs is Unsloth's own: the class forwards its ``pre_patch`` installs,
``CausalLM_fast_forward``, the single-token decode with its paged K/V buffers (already
plain torch), ``for_inference``/``for_training``, the LoRA decode branch with its
``_fast_lora`` copies. docs/gpu-path.md lists what only a GPU can check.
"""

from __future__ import annotations

import torch


class _DeviceProperties:
    name = "CPU (test double)"
    total_memory = 64 * 1024 ** 3
    major, minor = 8, 0
    multi_processor_count = 1
    gcnArchName = ""
    uuid = "cpu"


class _CpuIndex(str):
    """``"cpu:0"`` that also serves as list index 0 (Unsloth indexes per-device lists by it)."""

    def __new__(cls):
        return str.__new__(cls, "cpu:0")

    def __index__(self):
        return 0


def rms_layernorm(layernorm, X, gemma=False, **_):
    eps = getattr(layernorm, "variance_epsilon", None) or layernorm.eps
    x = X.float()
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(X.dtype)
    return y * (1.0 + layernorm.weight) if gemma else layernorm.weight * y


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_embedding(Q, K, cos, sin, rope_embedding_indices=None):
    """Q [B, H, L, D], K [B, Hkv, L, D]; ``cos``/``sin`` Unsloth's cache rows."""
    cos, sin = cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
    if rope_embedding_indices is None:
        c, s = cos[:Q.shape[2]], sin[:Q.shape[2]]
    else:
        idx = rope_embedding_indices.long()
        c, s = cos[idx].unsqueeze(1), sin[idx].unsqueeze(1)
    c, s = c.to(Q.dtype), s.to(Q.dtype)
    return Q * c + _rotate_half(Q) * s, K * c + _rotate_half(K) * s


def install() -> None:
    """Call after ``import unsloth`` (with ``UNSLOTH_ALLOW_CPU=1``)."""
    import unsloth.models.llama as llama

    torch.cuda.get_device_capability = lambda *a, **k: (8, 0)
    torch.cuda.get_device_properties = lambda *a, **k: _DeviceProperties()
    torch.cuda.get_device_name = lambda *a, **k: _DeviceProperties.name
    torch.cuda.mem_get_info = lambda *a, **k: (60 * 1024 ** 3, 64 * 1024 ** 3)
    llama.DEVICE_COUNT = 1
    llama.get_current_device = lambda: _CpuIndex()
    llama.DEVICE_TYPE_TORCH = "cpu"
    llama.fast_rms_layernorm = rms_layernorm
    llama.fast_rope_embedding = rope_embedding


def load_trained(base: str, adapter: str, max_seq_length: int = 256):
    """:func:`tarpo.models.loading.load_trained`'s Unsloth branch on the CPU (which ``resolve_backend``
    refuses without CUDA): Unsloth's loader in fp32, the saved adapter, ``tarpo.patches``."""
    import unsloth  # noqa: F401
    from peft import PeftModel

    from tarpo import patches
    from tarpo.models.loading import load_tokenizer, load_unsloth
    from tarpo.engine.router import Router
    install()
    model = PeftModel.from_pretrained(load_unsloth(base, max_seq_length, "float32"), adapter)
    patches.apply(model)
    return model, Router.load(adapter), load_tokenizer(base)
