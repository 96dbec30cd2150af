"""How the compiled decode step (:func:`tarpo.engine.static_decode.compiled_step`) is run at each step of a
rollout: over the attention span of the slots written so far, and on CUDA as captured CUDA graphs, replayed
(docs/rollout-engines.md, "What the compiled step is").

- **Attention over the positions written.** A step attends over the cache's first ``n`` slots only,
  ``n`` = the slots written so far rounded up to a multiple of :data:`ATTENTION_BUCKET` (at most the cache's
  length ``L``; :func:`attention_span`): early steps read a fraction of the K/V that late ones read. ``n`` is the
  length of the mask the step is given (a view ``mask[:, :n]``), compiled once as a dynamic size; on CUDA each
  span is captured as a graph of its own when the write position first reaches it (all of them sharing
  one memory pool). The slots past ``n`` are masked out anyway, so only the reduction's rounding differs
  from attending over all ``L`` (tests/test_static_decode.py).
- **CUDA graphs** (:class:`GraphedStep`): the first step runs as compiled code (and compiles),
  the second is captured into a ``torch.cuda.CUDAGraph`` and every later step replays it. We
  capture by hand rather than with ``mode="reduce-overhead"``: cudagraph trees free a call's
  outputs at the next call, and would re-record for every new cache address.
"""

from __future__ import annotations

import functools

import torch

ATTENTION_BUCKET = 256  # a step attends over the written slots rounded up to a multiple of this: one captured graph
                        # per multiple on CUDA (8 for the MATH preset's 2,048 positions), at most 255 slots over


class GraphedStep:
    """One decode step as a CUDA graph: call 1 runs the compiled step (compiling it, and warming
    up on a side stream), call 2 captures it and replays the capture, every later call replays.

    Capturing is sound because the step reads and writes only the rollout's static buffers,
    which outlive the graph; capturing does not run the kernels, hence the replay right after.
    The graph and its memory pool go with this object, at the end of the rollout.
    """

    def __init__(self, call, pool=None):
        self.call, self.pool, self.graph, self.warm = call, pool, None, False

    def __call__(self) -> None:
        if not self.warm:
            side = side_stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.call()
            torch.cuda.current_stream().wait_stream(side)
            self.warm = True
            return
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=self.pool):
                self.call()
        self.graph.replay()


_SIDE_STREAMS: dict[int, object] = {}


def side_stream():
    """The process's one side stream (per CUDA device) for the warm-up call before a capture. One per
    rollout would add a stream per rollout, and the caching allocator keeps a cuBLAS workspace per stream."""
    index = torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream()
    return _SIDE_STREAMS[index]


def attention_span(slot: int, cache_len: int) -> int:
    """The cache slots a step writing ``slot`` attends over: ``slot + 1`` rounded up to a multiple of
    :data:`ATTENTION_BUCKET`, at most the cache.

        >>> attention_span(0, 2048), attention_span(255, 2048), attention_span(256, 2048), attention_span(1999, 2048)
        (256, 256, 512, 2048)
    """
    return min(cache_len, -(-(slot + 1) // ATTENTION_BUCKET) * ATTENTION_BUCKET)


class SpanSteps:
    """What runs one step over a given attention span: ``self(n)`` calls ``call(mask[:, :n])``, the view made
    once per span and its length marked unbacked (one compiled graph serves every span, no guard on it). On CUDA
    each span's step is a :class:`GraphedStep`, all in one memory pool: the step returns nothing, so no tensor of
    one capture outlives it, and the graphs run one at a time."""

    def __init__(self, call, mask: torch.Tensor, device):
        self.call, self.mask, self.cuda = call, mask, torch.device(device).type == "cuda"
        self.views, self.graphs = {}, {}
        self.pool = torch.cuda.graph_pool_handle() if self.cuda else None

    def __call__(self, span: int) -> None:
        if span not in self.views:
            view = self.mask[:, :span]
            torch._dynamo.decorators.mark_unbacked(view, 1)
            self.views[span] = view
            if self.cuda:
                self.graphs[span] = GraphedStep(functools.partial(self.call, view), self.pool)
        if self.cuda:
            self.graphs[span]()
        else:
            self.call(self.views[span])


def step_runner(call, mask: torch.Tensor, device) -> SpanSteps:
    """What runs the rollout's steps, ``run(span)`` (:class:`SpanSteps`); a benchmark may wrap it to time them."""
    return SpanSteps(call, mask, device)
