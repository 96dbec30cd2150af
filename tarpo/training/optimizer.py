"""The trainer's optimizer parameter groups (docs/algorithm.md §5) and fp32 state for the small heads."""

from __future__ import annotations


def parameter_groups(model, router, gate, args) -> list[dict]:
    """The trainable parameters of ``model`` in groups: LoRA at ``learning_rate`` with ``weight_decay``;
    the router at ``router_lr`` without weight decay (its bias is the soft-rate prior b0, which decay
    would erode); HRPO's gate as HRPO's optimizer groups it, W_r and W_i at ``hrpo_lr`` and Lambda at
    ``hrpo_lambda_lr``, both with the weight decay. Empty groups are left out; ``router`` and ``gate`` may be
    None (a routing without them)."""
    router_ids = {id(p) for p in router.parameters()} if router is not None else set()
    gate_ids = {id(p) for p in gate.parameters()} if gate is not None else set()
    lam_ids = {id(gate.lam)} if gate is not None else set()
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if id(p) not in router_ids | gate_ids], "weight_decay": args.weight_decay},
        {"params": [p for p in trainable if id(p) in router_ids], "lr": args.router_lr, "weight_decay": 0.0},
        {"params": [p for p in trainable if id(p) in gate_ids - lam_ids], "lr": args.hrpo_lr,
         "weight_decay": args.weight_decay},
        {"params": [p for p in trainable if id(p) in lam_ids], "lr": args.hrpo_lambda_lr,
         "weight_decay": args.weight_decay},
    ]
    return [g for g in groups if g["params"]]


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
