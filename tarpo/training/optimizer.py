"""The trainer's optimizer parameter groups (docs/algorithm.md §5) and fp32 state for the small heads."""

from __future__ import annotations


def parameter_groups(model, router, soft_input, args) -> tuple[list[dict], list]:
    """The trainable parameters of ``model`` in groups, and those of the small heads (router, soft input) that keep
    fp32 optimizer state (:func:`keep_fp32_state`): LoRA at ``learning_rate`` with ``weight_decay``; the router at
    ``router_lr`` without weight decay (its bias is the soft-rate prior b0, which decay would erode); the soft
    input's own groups (:meth:`tarpo.engine.soft_input.SoftInputBase.parameter_groups`: HRPO's gate as HRPO's
    optimizer groups it). Empty groups are left out; ``router`` may be None (a routing without one)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    wanted = {id(p) for p in trainable}
    own = [{**g, "params": [p for p in g["params"] if id(p) in wanted]} for g in soft_input.parameter_groups(args)]
    router_params = [p for p in (router.parameters() if router is not None else ()) if id(p) in wanted]
    heads = router_params + [p for g in own for p in g["params"]]
    taken = {id(p) for p in heads}
    groups = [{"params": [p for p in trainable if id(p) not in taken], "weight_decay": args.weight_decay},
              {"params": router_params, "lr": args.router_lr, "weight_decay": 0.0}, *own]
    return [g for g in groups if g["params"]], heads


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
