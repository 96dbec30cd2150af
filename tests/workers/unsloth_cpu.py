"""Unsloth 2026.10.7's Python code on a CPU-only torch, for tests/test_unsloth_cpu.py.

With ``UNSLOTH_ALLOW_CPU=1`` Unsloth imports without a GPU, but three things stop its model
code from running here, and :func:`install` stands in for exactly those (test doubles, never
used outside the tests):

- device queries (``torch.cuda.get_device_capability`` and friends) answered with fixed values;
- Unsloth's per-device RoPE caches and decode scratch buffers, which it indexes by CUDA device
  and places on ``cuda:0``, get one slot on the CPU;
- its two Triton kernels on the prefill and training path, ``fast_rms_layernorm`` and
  ``fast_rope_embedding``, become the same arithmetic in eager torch.

And one branch that Unsloth takes only on a GPU is taken here too, so that the CPU sees the GPU's rule
(:func:`cuda_branches_on_cpu`): its SDPA mask preparation's ``_unmask_unattended``, which refuses a boolean
mask (on the H100, the eager Unsloth decode failed there while every CPU test passed).

Everything else that runs is Unsloth's own: the class forwards its ``pre_patch`` installs,
``CausalLM_fast_forward``, the single-token decode with its paged K/V buffers (already
plain torch), ``for_inference``/``for_training``, the LoRA decode branch with its
``_fast_lora`` copies. docs/gpu-path.md lists what only a GPU can check.
"""

from __future__ import annotations

import contextlib
import gc

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
    cuda_branches_on_cpu()
    # Not a stand-in, a test's speed: what is alive now (the imports) is never garbage, and frozen it is left out
    # of every later gc.collect(), which Unsloth's model loading calls about 15 times (0.25-0.35 s each over this
    # heap: 5 s of a launcher run's 6.3). Unsloth's train() freezes the same way (unsloth/models/_gc_train_scope.py)
    # and leaves alone a freeze it did not make.
    gc.freeze()


# (module, function, the CUDA-only condition as Unsloth 2026.10.7 writes it, what it becomes here)
CUDA_ONLY = [("unsloth.models._attn_mask_compat", "_prepare_4d_causal_attention_mask_for_sdpa",
              'expanded_4d_mask.device.type in ["cuda", "xpu"]',
              'expanded_4d_mask.device.type in ["cuda", "xpu", "cpu"]')]


def cuda_branches_on_cpu() -> None:
    """Re-define each function of CUDA_ONLY from its own source with the device condition widened to the CPU,
    and rebind it wherever Unsloth imported it by name. A source without the condition fails here, loudly:
    the pinned Unsloth changed, and what the GPU runs must be read again."""
    import importlib
    import inspect
    import sys
    import textwrap

    for module_name, name, condition, widened in CUDA_ONLY:
        module = importlib.import_module(module_name)
        original = getattr(module, name)
        source = textwrap.dedent(inspect.getsource(original))
        if source.count(condition) != 1:
            raise RuntimeError(f"{module_name}.{name} no longer reads {condition!r}: "
                               "update tests/workers/unsloth_cpu.py")
        scope = dict(module.__dict__)
        exec(compile(source.replace(condition, widened), inspect.getsourcefile(original), "exec"), scope)
        widened_fn = scope[name]
        for other in list(sys.modules.values()):
            if getattr(other, "__name__", "").startswith("unsloth") and getattr(other, name, None) is original:
                setattr(other, name, widened_fn)


class _Stream:
    """A CUDA stream (or event) on the CPU, where work is done when it is issued: waits are no-ops."""

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class _Slots(list):
    """Unsloth's per-device slot lists, indexed by ``tensor.device.index``: None (a CPU tensor's) is slot 0."""

    def __getitem__(self, index):
        return super().__getitem__(0 if index is None else index)

    def __setitem__(self, index, value):
        super().__setitem__(0 if index is None else index, value)


def install_offload(minimum_size: int = 0) -> None:
    """Unsloth's offloaded gradient checkpointing (``use_gradient_checkpointing="unsloth"``, unsloth_zoo's
    ``UnslothCheckpointFunction``) on the CPU. Its own switches: no pinned memory
    (``UNSLOTH_DISABLE_PINNED_MEMORY``), no double buffering, fp32 activations kept exactly
    (``UNSLOTH_OFFLOAD_FP32=exact``: on a GPU the activations are bf16 and kept exactly). Stood in for:
    the streams, the device count and the staging buffers (one device, the CPU; a CPU tensor's device index
    None read as 0), and the
    2 MB floor under which a layer's input is not offloaded (``minimum_size``; 0 offloads every
    checkpointed layer's input but the last, as a GPU does at real sizes)."""
    import unsloth_zoo.gradient_checkpointing as zoo

    stream = _Stream()
    zoo._compute_stream = zoo._main_stream = zoo._new_extra_stream = lambda index: stream
    zoo._double_buffer_event_ctor = lambda: _Stream
    zoo.torch_gpu_stream = lambda s: contextlib.nullcontext()
    zoo._visible_device_count = lambda: 1
    zoo._new_gpu_buffer = lambda index: torch.empty(zoo.INITIAL_GPU_BUFFER_SIZE, dtype=zoo.GPU_BUFFER_DTYPE)
    getitem, initialize = zoo._PerDeviceSlots.__getitem__, zoo.initialize_unsloth_gradient_checkpointing
    zoo._PerDeviceSlots.__getitem__ = lambda slots, index: getitem(slots, 0 if index is None else index)

    def initialize_on_cpu(dtype=None):
        initialize(dtype)
        zoo.NEXT_BUFFER_SLOT = _Slots(zoo.NEXT_BUFFER_SLOT)
        zoo.MINIMUM_SIZE = minimum_size
    zoo.initialize_unsloth_gradient_checkpointing = initialize_on_cpu


FUSED = ("LoRA_QKV", "LoRA_W", "LoRA_MLP")
FUSED_CALLS = dict.fromkeys(FUSED, 0)


def install_fused_lora() -> None:
    """Unsloth's fused LoRA autograd functions (``unsloth.kernels.fast_lora``: q/k/v, o, the SwiGLU MLP),
    which ``get_peft_model`` attaches to 16-bit weights, on the CPU: their forward and backward are torch
    but for the MLP's two Triton SwiGLU kernels, stood in for by Unsloth's own traced torch version of the
    backward (``_DWf_DW_dfg_traced``) and its arithmetic for the forward. Calls are counted in FUSED_CALLS."""
    import unsloth.kernels.fast_lora as fast_lora
    import unsloth.kernels.swiglu as swiglu

    def swiglu_fg(e, g):
        e32 = e.float()
        return (torch.sigmoid(e32) * e32).to(e.dtype) * g

    fast_lora.swiglu_fg_kernel = swiglu_fg
    fast_lora.swiglu_DWf_DW_dfg_kernel = swiglu._DWf_DW_dfg_traced
    for name in FUSED:
        cls = getattr(fast_lora, name)
        forward = cls.forward

        def counted(ctx, *args, _forward=forward, _name=name):
            FUSED_CALLS[_name] += 1
            return _forward(ctx, *args)
        cls.forward = staticmethod(counted)


def install_training() -> None:
    """What the launcher's training run needs on top of :func:`install`: :func:`install_offload`,
    :func:`install_fused_lora`;
    ``tarpo.models.loading.resolve_backend`` answering ``unsloth`` for ``BACKEND=unsloth`` (it asks for CUDA);
    no CPU time estimate (``tarpo.runs.training_run.cpu_run_estimate``: a run on a GPU makes none, and its probe
    calls the model as no GPU run does)."""
    import os
    for name, value in {"UNSLOTH_DISABLE_PINNED_MEMORY": "1", "UNSLOTH_DISABLE_DOUBLE_BUFFER": "1",
                        "UNSLOTH_OFFLOAD_FP32": "exact"}.items():
        os.environ[name] = value
    import unsloth  # noqa: F401

    from tarpo.models import loading
    from tarpo.runs import training_run
    install()
    training_run.cpu_run_estimate = lambda *args: 0.0
    install_offload()
    install_fused_lora()
    resolve = loading.resolve_backend
    loading.resolve_backend = lambda backend="auto": "unsloth" if backend == "unsloth" else resolve(backend)


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


def names_unsloth_loads(name: str) -> list[str]:
    """The names that reach transformers' ``AutoConfig.from_pretrained`` when
    :func:`tarpo.models.loading.load_unsloth` is given ``name`` (a hub id): each call is recorded and stopped,
    so nothing is downloaded or loaded, and Unsloth's loader gives up."""
    import transformers.models.auto.configuration_auto as auto

    from tarpo.models.loading import load_unsloth

    seen, original = [], auto.AutoConfig.from_pretrained

    def record(name_or_path, *args, **kwargs):
        seen.append(str(name_or_path))
        raise OSError("stopped by names_unsloth_loads")
    auto.AutoConfig.from_pretrained = record
    try:
        load_unsloth(name, 64, "float32")
    except Exception:  # noqa: BLE001  (Unsloth's own "Failed to load model", once both of its loads stopped)
        pass
    finally:
        auto.AutoConfig.from_pretrained = original
    return seen


def probe_sdpa_as_on_an_h100() -> None:
    """Unsloth's choice between ``enable_gqa`` and K/V expanded per query head for its dense SDPA calls
    (``unsloth/utils/attention_dispatch.py``, ``_sdpa_takes_gqa``), which on the CPU always passes ``enable_gqa``,
    made as on an H100 with torch 2.11: Unsloth's own rule (``_sdpa_gqa_state``: ``enable_gqa`` unless that leaves
    only the math kernel while expanded K/V would not) with the kernel torch would pick answered by
    tests/sdpa_rules.py, in place of ``torch._fused_sdp_choice``."""
    import unsloth.utils.attention_dispatch as dispatch
    from sdpa_rules import Call, kernel

    def takes_gqa(Q, K, is_causal, has_mask, V=None, dropout_p=0.0):
        V = K if V is None else V
        expanded = [(t.shape[0], Q.shape[1], *t.shape[2:]) for t in (K, V)]
        gqa = kernel(Call(tuple(Q.shape), tuple(K.shape), tuple(V.shape), bool(has_mask), True, bool(is_causal)))
        mha = kernel(Call(tuple(Q.shape), *expanded, bool(has_mask), False, bool(is_causal)))
        return not (gqa == "math" and mha != "math")
    dispatch._sdpa_takes_gqa = takes_gqa

