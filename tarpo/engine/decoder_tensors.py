"""The tensors the compiled engine's decoder (:func:`tarpo.engine.functional_decoder.forward`) computes with, read
from a Qwen2 or Llama model's modules once per rollout, whichever backend loaded it (docs/rollout-engines.md,
"One engine for every backend" and "Decode weights").

:func:`build` reads the tensors the modules hold: base weights and biases, the LoRA A and B matrices and
scaling of each active adapter, the norms, the rotary frequencies; and makes, at a merge level, the copies the
engine decodes with: the LoRA merged into copies of the projections that carry it, or applied as an adapter, one
product an adapter for the projections that read one input (:class:`Group`). :func:`merged_bytes` is what those
copies take; which level a rollout uses, and how often its weights are built, is
:mod:`tarpo.engine.decode_weights`'s.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..engineering_fields import MERGED_BLOCKS
from .backbone import unwrap


class Projection(NamedTuple):
    weight: torch.Tensor
    bias: torch.Tensor | None
    lora: tuple  # ((A, B, B's bias or None, scaling), ...) of the active adapters


class Group(NamedTuple):
    """Projections that read one input (q, k, v; gate, up): a base matmul each, and each adapter's LoRA as one
    product for all of them, ``A`` stacked ``[sum r, in]`` and ``B`` block-diagonal ``[sum out, sum r]``
    (:func:`_group`): two matmuls an adapter for the group instead of two per projection. ``lora`` is empty
    (each projection then applies its own) where the projections' adapters differ."""
    projections: tuple  # Projection each; their own lora only where ``lora`` is empty
    lora: tuple  # ((A, B, B's bias or None, scaling: float, or [sum out] fp32 where the projections' differ), ...)
    sizes: tuple  # the projections' output sizes (the split of a product)


class Layer(NamedTuple):
    input_norm: torch.Tensor
    qkv: Group
    o: Projection
    post_norm: torch.Tensor
    gate_up: Group
    down: Projection


class DecoderWeights(NamedTuple):
    layers: tuple
    norm: torch.Tensor
    inv_freq: torch.Tensor   # [D / 2] fp32 rotary inverse frequencies (the model's rope type, llama3 included)
    rope_scale: float        # transformers' attention_scaling of the rope type (1.0 for default and llama3)
    eps: float
    heads: int
    kv_heads: int
    head_dim: int


def _projection(module) -> Projection:
    """A linear layer, or a PEFT LoRA layer around one (its active, unmerged adapters)."""
    base = getattr(module, "base_layer", None)
    if base is None:
        return Projection(module.weight, module.bias, ())
    if getattr(module, "merged", False) or getattr(module, "disable_adapters", False):
        return Projection(base.weight, base.bias, ())
    lora = []
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if name in getattr(module, "lora_variant", {}):
            raise ValueError(f"the compiled engine computes plain LoRA; adapter {name!r} is a variant (DoRA, ...): "
                             "use ENGINE=eager")
        dropout = module.lora_dropout[name]
        if not isinstance(dropout, torch.nn.Identity) and dropout.p > 0:
            raise ValueError("the compiled engine applies no LoRA dropout: set LORA_DROPOUT=0 or use ENGINE=eager")
        lora.append((module.lora_A[name].weight, module.lora_B[name].weight, module.lora_B[name].bias,
                     float(module.scaling[name])))
    return Projection(base.weight, base.bias, tuple(lora))


def _group(*projections: Projection) -> Group:
    """The LoRA of projections that share an input as one product an adapter (:class:`Group`); the block
    structure makes each output column the dot product it was alone (the other blocks add exact zeros)."""
    sizes = tuple(p.weight.shape[0] for p in projections)
    adapters = [p.lora for p in projections]
    if not adapters[0] or any(len(a) != len(adapters[0]) for a in adapters):
        return Group(projections, (), sizes)
    lora = []
    for parts in zip(*adapters):  # the i-th active adapter of every projection
        a = torch.cat([part[0] for part in parts])
        b = torch.block_diag(*[part[1] for part in parts])
        bias = None
        if any(part[2] is not None for part in parts):
            bias = torch.cat([part[2] if part[2] is not None else part[1].new_zeros(part[1].shape[0])
                              for part in parts])
        scalings = [part[3] for part in parts]
        scaling = scalings[0] if len(set(scalings)) == 1 else torch.cat(
            [torch.full((size,), s, dtype=torch.float32, device=a.device) for size, s in zip(sizes, scalings)])
        lora.append((a, b, bias, scaling))
    return Group(tuple(p._replace(lora=()) for p in projections), tuple(lora), sizes)


def head_dim_of(config) -> int:
    """A head's width: the config's ``head_dim``, else the hidden size over the heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_frequencies(config, device) -> tuple[torch.Tensor, float]:
    """The inverse frequencies and scaling of the config's rope type, from transformers' own functions."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        dim = head_dim_of(config)
        inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return inv_freq.to(device), 1.0
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, device)
    return inv_freq, float(scale)


def _merged_weight(p: Projection) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``W + sum s B A`` and ``b + sum s b_B`` of a projection, in fp32 (the adapters summed before one rounding)."""
    weight, bias = p.weight.float(), None if p.bias is None else p.bias.float()
    for a, b, b_bias, scaling in p.lora:
        weight = weight + scaling * (b.float() @ a.float())
        if b_bias is not None:
            start = bias if bias is not None else torch.zeros_like(b_bias, dtype=torch.float32)
            bias = start + scaling * b_bias.float()
    return weight, bias


def _merged(p: Projection, dtype) -> Projection:
    """The projection with its LoRA merged into a copy in ``dtype`` (called where it carries LoRA, :func:`_merges`)."""
    weight, bias = _merged_weight(p)
    return Projection(weight.to(dtype), None if bias is None else bias.to(dtype), ())


def _merged_group(projections, dtype) -> Group:
    """Projections that read one input as one matrix, their LoRA merged in (a copy in ``dtype``): one product whose
    output is split by the projections' sizes."""
    merged = [_merged_weight(p) for p in projections]
    sizes = tuple(w.shape[0] for w, _ in merged)
    bias = None
    if any(b is not None for _, b in merged):
        bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in merged]).to(dtype)
    return Group((Projection(torch.cat([w.to(dtype) for w, _ in merged]), bias, ()),), (), sizes)


def _cast(p: Projection, dtype) -> Projection:
    """The projection with its LoRA matrices in ``dtype``, cast once (the cast autocast would make at every step)."""
    return p._replace(lora=tuple((a.to(dtype), b.to(dtype), None if bb is None else bb.to(dtype), s)
                                 for a, b, bb, s in p.lora))


def _layer_projections(layer) -> tuple:
    """One decoder layer's ``([q, k, v], o, [gate, up], down)`` as :class:`Projection` s (no copy)."""
    return ([_projection(getattr(layer.self_attn, f"{n}_proj")) for n in "qkv"], _projection(layer.self_attn.o_proj),
            [_projection(layer.mlp.gate_proj), _projection(layer.mlp.up_proj)], _projection(layer.mlp.down_proj))


def _merges(merge: str, qkv, o, gate_up, down) -> tuple[bool, bool, bool, bool]:
    """Whether q|k|v, o, gate|up and down are merged into copies at ``merge``: those the level covers (``all``:
    every one; ``attention``: q|k|v and o) that carry LoRA, a group where any of its projections does. A copy of
    weights without LoRA buys nothing measurable (gate|up as one matrix: 0.0-0.2% of the 3B's decode step on an
    H100, docs/rollout-engines.md), so none is made."""
    attention, mlp = "attention" in MERGED_BLOCKS[merge], "mlp" in MERGED_BLOCKS[merge]
    return (attention and any(p.lora for p in qkv), attention and bool(o.lora),
            mlp and any(p.lora for p in gate_up), mlp and bool(down.lora))


def _layer_weights(layer, merge: str, dtype) -> Layer:
    """One decoder layer's :class:`Layer` at merge level ``merge`` (``TarpoConfig.decode_merge``)."""
    qkv, o, gate_up, down = parts = _layer_projections(layer)
    m_qkv, m_o, m_gate_up, m_down = _merges(merge, *parts)
    return Layer(layer.input_layernorm.weight,
                 _merged_group(qkv, dtype) if m_qkv else _group(*(_cast(p, dtype) for p in qkv)),
                 _merged(o, dtype) if m_o else _cast(o, dtype), layer.post_attention_layernorm.weight,
                 _merged_group(gate_up, dtype) if m_gate_up else _group(*(_cast(p, dtype) for p in gate_up)),
                 _merged(down, dtype) if m_down else _cast(down, dtype))


def _compute_dtype(base) -> torch.dtype:
    """The dtype the compiled engine decodes in: the weights' 16-bit dtype, else fp32."""
    embed = base.get_input_embeddings().weight
    return embed.dtype if embed.dtype in (torch.bfloat16, torch.float16) else torch.float32


def merged_bytes(model, merge: str) -> int:
    """Bytes of the merged copies :func:`build` makes at ``merge`` (the weights of what :func:`_merges`
    merges, in the compute dtype; their biases and the adapter's cast matrices, well under 1% of it, left out):
    what :func:`tarpo.engine.decode_weights.merge_level` weighs against the free memory."""
    base = unwrap(model)
    total = 0
    for layer in base.get_decoder().layers:
        qkv, o, gate_up, down = parts = _layer_projections(layer)
        for group, on in zip((qkv, [o], gate_up, [down]), _merges(merge, *parts)):
            total += sum(p.weight.numel() for p in group) if on else 0
    return total * _compute_dtype(base).itemsize


def build(model, merge: str = "all") -> DecoderWeights:
    """The tensors of a Qwen2 or Llama causal LM (PEFT-wrapped or not, loaded by any backend), and the copies the
    compiled engine decodes with, in the compute dtype (the weights' 16-bit dtype, else fp32), built once per rollout:

    - ``merge="all"``: every adapter merged: q|k|v one matrix and gate|up one matrix where any of them carries
      LoRA, with it merged in (``W + s B A`` summed in fp32, rounded once); o and down merged where they carry LoRA;
      what carries no LoRA keeps the model's own weights (no copy, :func:`_merges`): 4 products a layer with LoRA
      on every linear layer, 5 with the paper's (q, k, v, o);
    - ``"attention"``: that for q|k|v and o; the MLP as ``"none"``;
    - ``"none"``: the model's own weights and the LoRA as an adapter, its matrices cast once (bit-identical to the
      cast autocast makes), grouped where projections share an input (:class:`Group`).

    The model's weights are never written (a bf16 round trip would drift them)."""
    base = unwrap(model)
    config, decoder = base.config, base.get_decoder()
    if getattr(config, "model_type", None) not in ("qwen2", "llama"):
        raise ValueError(f"the compiled engine decodes Qwen2 and Llama models, not {config.model_type!r}")
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        raise ValueError("the compiled engine has no sliding-window attention: use ENGINE=eager")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"the compiled engine's MLP is SwiGLU; hidden_act={config.hidden_act!r}")
    dtype = _compute_dtype(base)
    layers = tuple(_layer_weights(layer, merge, dtype) for layer in decoder.layers)
    inv_freq, scale = rotary_frequencies(config, decoder.norm.weight.device)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = head_dim_of(config)
    return DecoderWeights(layers, decoder.norm.weight, inv_freq, scale, float(config.rms_norm_eps), heads, kv_heads,
                          head_dim)
