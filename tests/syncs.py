"""Counting what would make the host wait for the GPU, on the CPU.

On a GPU the decode loop launches kernels and runs ahead of them; anything that needs a value
computed on the device blocks it until the queue drains. :class:`HostSyncs` counts such points while
it is active, by name, with the line of the caller outside torch that caused each:

- reading a value: ``_local_scalar_dense`` (``.item()``, ``bool(t)``, ``int(t)``, ``if t:``),
  ``.tolist()``, ``.cpu()``, ``.numpy()``;
- an output whose size depends on values: ``nonzero`` (``torch.where(cond)``, ``x[mask]`` and
  ``x[mask] = y`` with a boolean mask), ``masked_select``, ``unique``;
- a Python number sent to the device: ``torch.tensor`` / ``torch.as_tensor`` of a Python number
  or list with a ``device`` (a blocking host-to-device copy).

``torch.cuda.set_sync_debug_mode("error")`` is what a GPU says of the same points.
"""

from __future__ import annotations

import collections
import sys
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
            "unique_consecutive", "repeat_interleave"}


def _caller() -> str:
    """file:line of the innermost frame outside torch and this module."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        f = frame.filename
        if "/torch/" in f or f.endswith("syncs.py") or "/contextlib.py" in f:
            continue
        return f"{f.rsplit('/', 2)[-2]}/{f.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"


class HostSyncs(TorchDispatchMode):
    """``with HostSyncs() as s: ...``; then ``s.total``, ``s.by_name`` and ``s.where`` (caller -> count)."""

    def __init__(self):
        super().__init__()
        self.by_name, self.where = collections.Counter(), collections.Counter()
        self._patched = []

    @property
    def total(self) -> int:
        return sum(self.by_name.values())

    def record(self, name: str) -> None:
        self.by_name[name] += 1
        self.where[f"{name} at {_caller()}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        bool_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()) or ())
        if name in SYNC_OPS and not (name == "repeat_interleave" and (kwargs or {}).get("output_size")):
            self.record(name)
        elif bool_index:
            self.record(f"{name} with a boolean mask")
        return func(*args, **(kwargs or {}))

    def _patch(self, owner, name, wrap):
        original = getattr(owner, name)
        self._patched.append((owner, name, original))
        setattr(owner, name, wrap(original))

    def __enter__(self):
        def counted(label):
            def wrap(original):
                def method(*args, **kwargs):
                    self.record(label)
                    return original(*args, **kwargs)
                return method
            return wrap

        def to_device(label):
            def wrap(original):
                def make(data, *args, **kwargs):
                    if kwargs.get("device") is not None and isinstance(data, (int, float, bool, list, tuple)):
                        self.record(label)
                    return original(data, *args, **kwargs)
                return make
            return wrap

        for name in ("tolist", "cpu", "numpy"):
            self._patch(torch.Tensor, name, counted(f".{name}()"))
        self._patch(torch, "tensor", to_device("torch.tensor(<python value>, device=)"))
        self._patch(torch, "as_tensor", to_device("torch.as_tensor(<python value>, device=)"))
        return super().__enter__()

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched.clear()
        return super().__exit__(*exc)

    def report(self) -> str:
        return "\n".join(f"{n:5d}  {w}" for w, n in self.where.most_common())


def per_decode_step(run):
    """``run()`` (a rollout) under :class:`HostSyncs`, the eager engine's decode steps marked: returns the
    syncs made from each step's start to the next step's (the last step's window, which holds the rollout's
    tail, is left out), ``run()``'s result and the counter."""
    import tarpo.engine.rollout as rollout

    marks, step = [], rollout.hybrid_step

    def marked(*args, **kwargs):
        marks.append(counter.total)
        return step(*args, **kwargs)
    rollout.hybrid_step = marked
    try:
        with HostSyncs() as counter:
            out = run()
    finally:
        rollout.hybrid_step = step
    return [b - a for a, b in zip(marks, marks[1:])], out, counter


if __name__ == "__main__":  # a quick look: python tests/syncs.py
    with HostSyncs() as s:
        x = torch.arange(5)
        bool(x.sum())
        x[x > 2]
        torch.as_tensor(3, device="cpu")
    print(s.report(), file=sys.stderr)
