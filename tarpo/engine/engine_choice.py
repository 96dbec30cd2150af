"""``ENGINE=auto``: the rollout engine whose cost the run's work repays (docs/rollout-engines.md).

- **CUDA**: the compiled step for a backbone that feeds ``inputs_embeds`` to the transformers
  decoder; the eager loop for one with its own decode path (Unsloth's).
- **CPU**: the compiled step runs a token about ``COMPILED_SPEEDUP`` times faster than the eager
  loop (``benchmarks/bench_rollout.py``), but inductor's C++ build of it costs about
  ``COMPILE_BASE_S + COMPILE_PER_LAYER_S * layers`` seconds with a cold cache (2-layer test model:
  56 s; 30-layer 135M model: about 1,400 s). It is picked only when the decode time it would save
  over the run's remaining decode steps, at the measured eager speed, is larger than that.

    >>> cpu_choice(layers=30, decode_steps=200, eager_step_s=0.6)[0]     # 16 GSM8K questions, 30 layers
    'eager'
    >>> cpu_choice(layers=4, decode_steps=4800, eager_step_s=0.008)[0]   # the CPU demo's RL run
    'eager'
    >>> cpu_choice(layers=2, decode_steps=100_000, eager_step_s=0.01)[0] # a long run of a shallow model
    'compiled'
"""

from __future__ import annotations

COMPILED_SPEEDUP = 2.4     # eager / compiled seconds per decode step, CPU (benchmarks/bench_rollout.py)
COMPILE_BASE_S = 20.0      # cold-cache compile of the step on the CPU, fixed part (seconds)
COMPILE_PER_LAYER_S = 45.0  # and per decoder layer (inductor unrolls the layers into one graph)


def cpu_choice(layers: int, decode_steps: int, eager_step_s: float) -> tuple[str, str]:
    """``(engine, why)`` on the CPU for ``decode_steps`` more steps of an eager step of ``eager_step_s``."""
    compile_s = COMPILE_BASE_S + COMPILE_PER_LAYER_S * layers
    saved_s = decode_steps * eager_step_s * (1 - 1 / COMPILED_SPEEDUP)
    engine = "compiled" if saved_s > compile_s else "eager"
    why = (f"CPU: compiling the step (~{compile_s:.0f} s for {layers} layers) would save ~{saved_s:.0f} s over "
           f"{decode_steps} decode steps of {eager_step_s * 1000:.1f} ms")
    return engine, why


def decoder_layers(model) -> int:
    """The number of decoder layers of a transformers causal LM (PEFT-wrapped or not)."""
    config = getattr(model, "config", None)
    return int(getattr(config, "num_hidden_layers", 0) or 0)


class RunEngine:
    """The engine of each rollout of a training run with ``rollout_engine`` (``auto`` decides by cost).

    On the CPU the first rollout runs eagerly and is timed; the engine of the remaining ones is then
    chosen once by :func:`cpu_choice` (both engines draw the same keyed noise, so the trajectories
    do not depend on the choice: tests/test_static_decode.py). ``decision`` holds the engine and why,
    once known."""

    def __init__(self, requested: str, layers: int):
        self.requested, self.layers = requested, layers
        self.decision: dict | None = None

    def next(self, cuda: bool, own_decode_path: bool) -> str:
        """The engine of the next rollout."""
        if self.requested != "auto":
            return self.requested
        if self.decision is None and (cuda or own_decode_path):
            engine = "eager" if own_decode_path else "compiled"
            why = "the backbone decodes on its own path (Unsloth)" if own_decode_path else "CUDA"
            self.decision = {"requested": "auto", "engine": engine, "why": why}
        return "eager" if self.decision is None else self.decision["engine"]

    def observed(self, seconds: float, decode_steps: int, steps_ahead: int) -> dict | None:
        """After the timed first (eager) rollout on the CPU: decide; returns the new decision, else None."""
        if self.requested != "auto" or self.decision is not None or decode_steps < 1:
            return None
        engine, why = cpu_choice(self.layers, steps_ahead, seconds / decode_steps)
        self.decision = {"requested": "auto", "engine": engine, "why": why}
        return self.decision
