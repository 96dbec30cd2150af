"""The project's engineering settings of :class:`tarpo.config.TarpoConfig`: how the rollout is decoded (the engine,
its decode weights, finished rows dropped), how the training forward is chunked, and how a run meets a non-finite
step or a scheduler's stop signal. None changes what the method computes (docs/rollout-engines.md,
docs/design-notes.md).

:class:`EngineeringFields` is a dataclass mixin of ``TarpoConfig``, as :class:`tarpo.method_fields.MethodFields` is.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

ENGINES = ("auto", "eager", "compiled")  # rollout engines (tarpo.engine.rollout, tarpo.engine.static_decode)
# what the compiled engine decodes with (tarpo.engine.decode_weights): the LoRA merged into copies of the projections
# that carry it (q|k|v and o; "all": gate|up and down too) or applied as an adapter; "auto": the memory plan's, or
# without a plan the free memory's; the levels after "auto" from the most copies to none
DECODE_MERGES = ("auto", "all", "attention", "none")
# the blocks each level merges into copies where they carry LoRA: the engine's build (tarpo.engine.decoder_tensors)
# and the memory plan's count of its copies (tarpo.engine.memory_plan.decode_copy_elements) read it here
MERGED_BLOCKS = {"all": ("attention", "mlp"), "attention": ("attention",), "none": ()}


def signal_numbers(names) -> list[int]:
    """Signals by name (``SIGTERM`` or ``TERM``, any case) as numbers; an unknown name raises ``ValueError``.

    >>> [int(s) for s in signal_numbers(["TERM", "sigusr1"])] == [signal.SIGTERM, signal.SIGUSR1]
    True
    """
    out = []
    for name in names:
        full = name.strip().upper()
        full = full if full.startswith("SIG") else "SIG" + full
        if full in ("SIGKILL", "SIGSTOP") or not isinstance(getattr(signal, full, None), signal.Signals):
            raise ValueError(f"{name!r} is not a signal a process can catch (e.g. SIGTERM, SIGUSR1)")
        out.append(getattr(signal, full))
    return out


@dataclass
class EngineeringFields:
    max_nonfinite_steps: int = field(default=3, metadata={
        "help": "A step whose loss or gradient norm is not finite is skipped (no parameter, optimizer state or LR "
                "schedule changes; counted as nonfinite_steps); this many in a row stop the run, naming the last "
                "complete checkpoint (tarpo.training.nonfinite)."})
    save_on_signals: list[str] = field(default_factory=list, metadata={
        "help": "Signals (e.g. SIGTERM, SIGUSR1) that stop training after the step in flight with a complete "
                "checkpoint, as a scheduler's preemption asks (tarpo.training.preemption). Empty (TRL's behaviour): "
                "none; the launchers set SIGTERM and SIGUSR1."})
    time_scoring: bool = field(default=False, metadata={
        "help": "Log timing/scoring_s: the seconds of a micro-batch's training forward (policy and reference scored, "
                "before the backward), averaged over the step's micro-batches, the device synchronised around it. Off "
                "by default: each synchronisation stalls the host's queue of kernels (tarpo.training.callbacks)."})
    logprob_chunk_size: int = field(
        default=1024, metadata={"help": "Positions per chunk when scoring log-probs and the full-vocabulary KL, "
                                        "so no full fp32 [B, T, V] tensor is ever held (docs/algorithm.md §2)."})
    rollout_engine: str = field(
        default="auto", metadata={"help": "Decode engine of the rollouts: 'eager', the reference loop (any backend; "
                                          "with BACKEND=unsloth it is Unsloth's fast decode path); 'compiled', one "
                                          "static-shape step under torch.compile (CUDA graphs on CUDA) over the "
                                          "model's own tensors, any backend (tarpo.engine.static_decode); 'auto', "
                                          "the choice of tarpo.engine.engine_choice (compiled on CUDA; eager on the "
                                          "CPU unless the run's timed first rollout shows compiling repays). In "
                                          "training both engines draw the same samples (docs/rollout-engines.md)."})
    decode_merge: str = field(
        default="auto", metadata={"help": "What the compiled engine decodes with (docs/rollout-engines.md, 'Decode "
                                          "weights'): 'all' every LoRA merged into a copy of the projections that "
                                          "carry it (W + s B A, summed in fp32); 'attention' q|k|v and o's only; "
                                          "'none' the LoRA as an adapter. Weights without LoRA are never copied. "
                                          "'auto': the memory plan's choice, or without a plan the first whose copies "
                                          "and KV cache fit in 80% of the free memory."})
    compact_finished_rows: bool = field(
        default=True, metadata={"help": "Drop finished rows from the decode batch and KV cache so they stop "
                                        "costing work (docs/algorithm.md §1). Changes the random stream versus "
                                        "transformers' generate once a row ends; results stay exact."})

    def engineering_problems(self):
        """``(field, why)`` for each invalid engineering setting, in order (TarpoConfig refuses the first)."""
        if self.logprob_chunk_size < 1:
            yield "logprob_chunk_size", "must be >= 1"
        if self.rollout_engine not in ENGINES:
            yield "rollout_engine", f"must be one of {', '.join(ENGINES)}"
        if self.decode_merge not in DECODE_MERGES:
            yield "decode_merge", f"must be one of {', '.join(DECODE_MERGES)}"
        if self.max_nonfinite_steps < 1:
            yield "max_nonfinite_steps", "must be >= 1"
        try:
            signal_numbers(self.save_on_signals)
        except ValueError as exc:
            yield "save_on_signals", str(exc)
