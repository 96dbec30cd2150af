"""Tensor memory measured on the CPU, for the memory plan's tests (tests/test_memory_plan.py): a CPU tensor
has no allocator statistics, so the storages are counted as torch's dispatcher creates and passes them."""

from __future__ import annotations

import gc
import warnings
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveStorage(TorchDispatchMode):
    """Peak bytes of the tensor storages created while active and still alive (views of tensors
    made before, weights included, are not counted)."""

    def __init__(self):
        super().__init__()
        self.live, self.now, self.peak = {}, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self.live or key in inputs or storage.nbytes() == 0:
                continue
            self.live[key] = storage.nbytes()
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
            weakref.finalize(storage, self._free, key)
        return out

    def _free(self, key):
        self.now -= self.live.pop(key, 0)


def _storage(t: torch.Tensor):
    from torch.distributed.tensor import DTensor
    return (t._local_tensor if isinstance(t, DTensor) else t).untyped_storage()


class HeldStorage(TorchDispatchMode):
    """Peak bytes of every tensor storage this process holds: the ones alive when the mode starts (every
    tensor Python can reach: weights, shards, optimizer state, FSDP's all-gather buffers) and every one an
    operation reads or makes while it is active, each counted at its size of the moment. FSDP2 frees and
    re-allocates its gathered parameters by resizing their storages in place (no operation the dispatcher
    sees), so the sizes are read again at every operation, not only when a storage is made.

    What the CUDA allocator would report as allocated, less its rounding; tensors that no operation touches
    and that Python cannot reach (none in these tests) are missed."""

    def __init__(self):
        super().__init__()
        self.held, self.peak = {}, 0

    def __enter__(self):
        gc.collect()
        with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated names warns
            warnings.simplefilter("ignore")
            tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
        for t in tensors:
            self._hold(t)
        self._count()
        return super().__enter__()

    def _hold(self, t):
        try:
            storage = _storage(t)
        except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, fake)
            return
        if id(storage) not in self.held:
            self.held[id(storage)] = weakref.ref(storage)

    def _count(self):
        now = 0
        for key, ref in list(self.held.items()):
            storage = ref()
            if storage is None:
                del self.held[key]
            else:
                now += storage.nbytes()
        self.peak = max(self.peak, now)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._count()  # before: sizes changed by resizes since the last operation
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor):
                self._hold(t)
        self._count()
        return out
