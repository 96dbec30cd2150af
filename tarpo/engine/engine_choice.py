"""The rollout engine: ``eager``, ``compiled``, or ``auto``, the one whose cost the run's work repays
(docs/rollout-engines.md). :func:`engine_for` is the rule every caller uses; :class:`EngineChooser` applies it
to a training run, deciding on the CPU by cost.

- **CUDA**: the compiled step, whichever backend loaded the model (it decodes the model's own tensors,
  :mod:`tarpo.engine.functional_decoder`).
- **CPU**: the compiled step runs a token about ``COMPILED_SPEEDUP`` times faster than the eager
  loop (``benchmarks/bench_rollout.py``), but inductor's C++ build of it costs about
  ``COMPILE_BASE_S + COMPILE_PER_LAYER_S * layers`` seconds with a cold cache (the layer a nested
  compile region, built once: docs/rollout-engines.md, the measurements of attention over the written slots,
  grouped LoRA and regional compile). It is picked only when
  the decode time it would save over the run's remaining decode steps, at the measured eager speed,
  is larger than ``CHOICE_MARGIN`` times that.

    >>> cpu_choice(layers=30, decode_steps=200, eager_step_s=0.24)[0]    # a 135M model, 16 GSM8K questions x 2
    'eager'
    >>> cpu_choice(layers=4, decode_steps=4800, eager_step_s=0.008)[0]   # the CPU demo's RL run
    'eager'
    >>> cpu_choice(layers=2, decode_steps=100_000, eager_step_s=0.01)[0] # a long run of a shallow model
    'compiled'
"""

from __future__ import annotations

from ..engineering_fields import ENGINES

COMPILED_SPEEDUP = 2.4     # eager / compiled seconds per decode step, CPU (benchmarks/bench_rollout.py)
# cold-cache compile of the step on the CPU, 135M shape (SmolLM2-135M's, LoRA r 32 on q/k/v/o), 2-core AMD EPYC,
# benchmarks/bench_write_positions.py: 37.4 s at 2 layers, 39.5 s at 8, 47.7 s at 30 (least squares, rounded up)
COMPILE_BASE_S = 37.0      # fixed part (seconds): tracing, the step's non-layer code, the C++ build of it all
COMPILE_PER_LAYER_S = 0.4  # per decoder layer: the layer is compiled once (a nested compile region), then reused
# compiled only where it would save this many times its estimated compile: the estimate is one machine's, and a
# slower CPU compiles slower too (the CPU demo's RL run would save ~25 s against ~39 s: it stays eager with room)
CHOICE_MARGIN = 2.0


def cpu_choice(layers: int, decode_steps: int, eager_step_s: float) -> tuple[str, str]:
    """``(engine, why)`` on the CPU for ``decode_steps`` more steps of an eager step of ``eager_step_s``."""
    compile_s = COMPILE_BASE_S + COMPILE_PER_LAYER_S * layers
    saved_s = decode_steps * eager_step_s * (1 - 1 / COMPILED_SPEEDUP)
    engine = "compiled" if saved_s > CHOICE_MARGIN * compile_s else "eager"
    why = (f"CPU: compiling the step (~{compile_s:.0f} s for {layers} layers) would save ~{saved_s:.0f} s over "
           f"{decode_steps} decode steps of {eager_step_s * 1000:.1f} ms")
    return engine, why


def check_engine(engine: str, setting: str = "rollout_engine") -> str:
    """``engine`` if it names a rollout engine (:data:`tarpo.engineering_fields.ENGINES`), else refused naming
    ``setting``."""
    if engine not in ENGINES:
        raise ValueError(f"{setting}={engine!r}: must be one of {', '.join(ENGINES)}")
    return engine


def engine_for(engine: str, cuda: bool, setting: str = "rollout_engine") -> str:
    """The engine of a rollout on a GPU (``cuda``) or the CPU; a name that is no engine is refused, naming
    ``setting``. ``auto`` is the compiled engine on a GPU, the eager loop on the CPU (where a training run
    may still switch after timing its first rollout: :class:`EngineChooser`).

        >>> engine_for("auto", cuda=True), engine_for("auto", cuda=False), engine_for("eager", cuda=True)
        ('compiled', 'eager', 'eager')
    """
    if check_engine(engine, setting) != "auto":
        return engine
    return "compiled" if cuda else "eager"


def decoder_layers(model) -> int:
    """The number of decoder layers of a transformers causal LM (PEFT-wrapped or not)."""
    config = getattr(model, "config", None)
    return int(getattr(config, "num_hidden_layers", 0) or 0)


class EngineChooser:
    """The engine of each rollout of a training run with ``rollout_engine`` (``auto`` decides by cost).

    On the CPU the first rollout runs eagerly and is timed; the engine of the remaining ones is then
    chosen once by :func:`cpu_choice` (both engines draw the same keyed noise, so the trajectories
    do not depend on the choice: tests/test_static_decode.py). ``decision`` holds the engine and why,
    once known."""

    def __init__(self, requested: str, layers: int):
        self.requested, self.layers = requested, layers
        self.decision: dict | None = None

    def next(self, cuda: bool) -> str:
        """The engine of the next rollout: :func:`engine_for`'s, until ``auto`` has decided (at once on a GPU)."""
        if self.decision is not None:
            return self.decision["engine"]
        engine = engine_for(self.requested, cuda)
        if self.requested == "auto" and cuda:
            self.decision = {"requested": "auto", "engine": engine, "why": "CUDA"}
        return engine

    def observed(self, seconds: float, decode_steps: int, steps_ahead: int) -> dict | None:
        """After the timed first (eager) rollout on the CPU: decide; returns the new decision, else None."""
        if self.requested != "auto" or self.decision is not None or decode_steps < 1:
            return None
        engine, why = cpu_choice(self.layers, steps_ahead, seconds / decode_steps)
        self.decision = {"requested": "auto", "engine": engine, "why": why}
        return self.decision
