"""accelerate's FSDP on the CPU (gloo), for tests/test_fsdp.py: a test double, never used outside the tests.

accelerate 1.15 turns ``ACCELERATE_USE_FSDP`` (and an ``FSDP`` accelerate config) into its FSDP plugin only
for GPU-like distributed types: a multi-process CPU run (``ACCELERATE_USE_CPU=true``, type ``MULTI_CPU``)
silently trains data-parallel instead. :func:`install` makes that one decision as on a GPU: where the
accelerator was given an FSDP plugin, the distributed type is ``FSDP``. Everything else is accelerate's and
torch's own: ``fsdp2_prepare_model`` shards the model with ``fully_shard`` on the default CPU mesh, the
Trainer's FSDP checkpointing (``torch.distributed.checkpoint``), gloo collectives.
"""

from __future__ import annotations


def install() -> None:
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__
    if getattr(original, "_fsdp_on_cpu", False):
        return

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None:
            # AcceleratorState copies PartialState's type at every construction: set it in both
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    init._fsdp_on_cpu = True
    AcceleratorState.__init__ = init


def install_run_doubles() -> None:
    """For launcher runs in tests/test_fsdp.py, from the environment: ``TARPO_TEST_REWARD=vowels`` trains on the
    share of vowels (a tiny random model earns no GSM8K reward, and zero advantages would train nothing), and
    ``TARPO_TEST_KILL_AFTER=N`` SIGKILLs rank 0 once checkpoint-N is published (no ``finally``, nothing flushed);
    ``TARPO_TEST_SIGNAL_AT=N`` sends rank 1 alone SIGTERM when step N begins (a preemption that reaches one process:
    the others learn of it from the processes' agreement, tarpo.training.preemption.any_process)."""
    import os
    import signal

    if os.environ.get("TARPO_TEST_REWARD") == "vowels":
        import tarpo.tasks.graders as graders

        def vowels(prompts, completions, **columns):
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]
        graders.reward_function = lambda task, *a, **k: vowels
    signal_at = os.environ.get("TARPO_TEST_SIGNAL_AT")
    if signal_at:  # rank 1 signals itself when step N begins; rank 0 hears of it only through the agreement
        from transformers.trainer_callback import CallbackHandler

        begin = CallbackHandler.on_step_begin

        def on_step_begin(self, args, state, control):
            if state.global_step == int(signal_at) - 1 and args.process_index == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return begin(self, args, state, control)
        CallbackHandler.on_step_begin = on_step_begin
    kill = os.environ.get("TARPO_TEST_KILL_AFTER")
    if kill:
        from tarpo.training.trainer import TarpoTrainer

        save = TarpoTrainer._save_checkpoint

        def save_then_die(self, model, trial):
            save(self, model, trial)
            if self.state.global_step == int(kill) and self.accelerator.is_main_process:
                os.kill(os.getpid(), signal.SIGKILL)
        TarpoTrainer._save_checkpoint = save_then_die
