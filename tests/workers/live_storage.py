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
        self.held, self.sizes, self.now, self.peak = {}, {}, 0, 0

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
        """The storage of ``t``, held (weakly) from now on; None for a tensor without one (meta, fake)."""
        try:
            storage = _storage(t)
        except (RuntimeError, NotImplementedError):
            return None
        ref = self.held.get(id(storage))
        if ref is None or ref() is not storage:  # new, or a dead storage's id taken by this one
            self.held[id(storage)] = weakref.ref(storage)
        return storage

    def _count(self):
        """Every held storage's size read again (FSDP2's resizes and the storages freed since the last operation)."""
        now, sizes = 0, {}
        for key, ref in list(self.held.items()):
            storage = ref()
            if storage is None:
                del self.held[key]
            else:
                sizes[key] = size = storage.nbytes()
                now += size
        self.sizes, self.now = sizes, now
        self.peak = max(self.peak, now)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._count()  # before: sizes changed by resizes since the last operation
        out = func(*args, **(kwargs or {}))
        # after: an operation changes only the storages it is given or returns (made, written, resized), so only
        # theirs are read again (a second full count, as before, read the same total at twice the cost)
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor) and (storage := self._hold(t)) is not None:
                size = storage.nbytes()
                self.now += size - self.sizes.get(id(storage), 0)
                self.sizes[id(storage)] = size
        self.peak = max(self.peak, self.now)
        return out
