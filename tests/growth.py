"""What could grow from one training step to the next, counted: for the tests that check nothing does.

:func:`snapshot` reads, from a model and the process:

- ``hooks``: module name -> number of forward / forward-pre / backward / backward-pre hooks on it;
- ``buffers``: the registered buffers (name, shape, dtype), and the tensors kept as plain attributes
  of a module (``module.__dict__``: what Unsloth's decode leaves on its attention modules);
- ``checkpointing``: each module's gradient-checkpointing flag and checkpoint function;
- ``graphs``: the graphs dynamo has compiled in this process, and the compiled-step cache of
  :mod:`tarpo.engine.static_decode`;
- ``tensors``: the number of live tensors the garbage collector can see, and the bytes of their
  distinct storages (after a collection).

:class:`GrowthProbe` takes one at the end of chosen optimizer steps of a Trainer run.
"""

from __future__ import annotations

import collections
import gc

import torch
from transformers import TrainerCallback

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def hooks(model: torch.nn.Module) -> dict[str, int]:
    out = {}
    for name, module in model.named_modules(remove_duplicate=False):
        n = sum(len(getattr(module, attr, {})) for attr in HOOK_DICTS)
        if n:
            out[name or "<root>"] = out.get(name or "<root>", 0) + n
    return out


def buffers(model: torch.nn.Module) -> list[tuple]:
    registered = [(n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    attributes = [(f"{name}.{attr}", tuple(v.shape), str(v.dtype))
                  for name, module in model.named_modules() for attr, v in vars(module).items()
                  if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)]
    return sorted(registered) + sorted(attributes)


def checkpointing(model: torch.nn.Module) -> list[tuple]:
    """(module, its ``gradient_checkpointing`` flag, its checkpoint function) for every module that has one."""
    def name(fn):
        if fn is None:
            return None
        inner = getattr(fn, "func", fn)
        return f"{inner.__module__}.{inner.__qualname__}{sorted(getattr(fn, 'keywords', {}).items())}"
    return [(n, m.gradient_checkpointing, name(getattr(m, "_gradient_checkpointing_func", None)))
            for n, m in model.named_modules() if hasattr(m, "gradient_checkpointing")]


def graphs() -> dict[str, int]:
    from torch._dynamo.utils import counters

    from tarpo.engine import static_decode
    return {"dynamo_unique_graphs": int(counters["stats"]["unique_graphs"]),
            "compiled_steps": len(static_decode._COMPILED)}


def tensors() -> dict:
    """Live tensors: their number, the bytes of their distinct storages and, for a message, how many of
    each (shape, dtype)."""
    gc.collect()
    count, storages, kinds = 0, {}, collections.Counter()
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor):
                continue
            storage = obj.untyped_storage()
            key = (storage.device.type, storage.data_ptr())
        except Exception:  # noqa: BLE001  (what cannot say where it lives: dynamo's fake tensors it keeps)
            continue
        count += 1
        storages[key] = storage.nbytes()
        kinds[(tuple(obj.shape), str(obj.dtype))] += 1
    return {"count": count, "bytes": sum(storages.values()), "kinds": dict(kinds)}


def snapshot(model: torch.nn.Module) -> dict:
    return {"hooks": hooks(model), "buffers": buffers(model), "checkpointing": checkpointing(model),
            "graphs": graphs(), "tensors": tensors()}


class GrowthProbe(TrainerCallback):
    """A snapshot of the trained model when training begins (step 0) and at the end of each optimizer step
    in ``steps``."""

    def __init__(self, steps):
        self.steps, self.taken = set(steps), {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.taken[state.global_step] = snapshot(model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.steps:
            self.taken[state.global_step] = snapshot(model)


def differences(a: dict, b: dict) -> dict:
    """The parts of two snapshots that differ: ``{part: (a's, b's)}``."""
    return {k: (a[k], b[k]) for k in a if a[k] != b[k]}
