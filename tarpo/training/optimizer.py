"""The trainer's optimizer parameter groups (docs/algorithm.md §5) and fp32 state for the small heads."""

from __future__ import annotations


def parameter_groups(model, router, soft_input, args, decay_names=None) -> tuple[list[dict], list]:
    """The trainable parameters of ``model`` in groups, and those of the small heads (router, soft input) that keep
    fp32 optimizer state (:func:`keep_fp32_state`): the model's (LoRA, or every weight in full fine-tuning) at
    ``learning_rate``, with ``weight_decay`` where transformers decays (``decay_names``: the Trainer's
    ``get_decay_parameter_names``; norm weights and biases without; None: all with); the router at
    ``router_lr`` without weight decay (its bias is the soft-rate prior b0, which decay would erode); the soft
    input's own groups (:meth:`tarpo.engine.soft_input.SoftInputBase.parameter_groups`: HRPO's gate as HRPO's
    optimizer groups it). Empty groups are left out; ``router`` may be None (a routing without one)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    wanted = {id(p) for p in trainable}
    own = [{**g, "params": [p for p in g["params"] if id(p) in wanted]} for g in soft_input.parameter_groups(args)]
    router_params = [p for p in (router.parameters() if router is not None else ()) if id(p) in wanted]
    heads = router_params + [p for g in own for p in g["params"]]
    taken = {id(p) for p in heads}
    decayed = {id(p) for n, p in model.named_parameters() if decay_names is None or n in decay_names}
    rest = [p for p in trainable if id(p) not in taken]
    groups = [{"params": [p for p in rest if id(p) in decayed], "weight_decay": args.weight_decay},
              {"params": [p for p in rest if id(p) not in decayed], "weight_decay": 0.0},
              {"params": router_params, "lr": args.router_lr, "weight_decay": 0.0}, *own]
    return [g for g in groups if g["params"]], heads


def embedding_weights(model) -> list:
    """The trained embedding tables (full fine-tuning): transformers gives them 32-bit state under an 8-bit
    optimizer, and so does :func:`keep_fp32_state`."""
    import torch

    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.weight.requires_grad]


def keep_fp32_state(optimizer, params) -> None:
    """Give ``params`` 32-bit optimizer state under a bitsandbytes 8-bit optimizer.

    bitsandbytes quantises the Adam moments of every tensor with at least ``min_8bit_size``
    (4096) elements; a 2-row policy head can be that large (Qwen2.5-3B's router weight is
    2 x 2048 = 4096, 7B's 2 x 3584) and so is HRPO's gate, and neither should be quantised.
    bitsandbytes' per-parameter ``override_config`` does it; its manager is process-wide and
    keyed by ``id(param)``, so entries of an earlier run's freed tensors could land on
    unrelated new ones: this optimizer gets a manager of its own. Other optimizers are left
    as they are.
    """
    try:
        from bitsandbytes.optim import GlobalOptimManager
        from bitsandbytes.optim.optimizer import Optimizer8bit
    except Exception:  # no (working) bitsandbytes: the optimizer cannot be an 8-bit one
        return
    if not isinstance(optimizer, Optimizer8bit) or not params:
        return
    if not isinstance(getattr(optimizer, "mng", None), GlobalOptimManager):
        raise RuntimeError(f"{type(optimizer).__name__} has no bitsandbytes config manager `mng`: cannot keep the "
                           "router's optimizer state in fp32 (bitsandbytes==0.50.2 expected)")
    manager = GlobalOptimManager.__new__(GlobalOptimManager)
    manager.initialize()
    manager.override_config(params, "optim_bits", 32)
    optimizer.mng = manager
