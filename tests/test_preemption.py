"""A stop signal at any moment (tarpo.training.preemption): the handlers are put back on every way out of
``train()``, an exception included; each ``train()`` call starts afresh; a second signal goes to the handler that was
there before (the default one ends the process); a handler Python did not install is put back as the default."""

import os
import signal

import pytest
from transformers import TrainerCallback

from helpers import letter_reward, make_args, make_dataset
from tarpo.models.tiny import tiny_causal_lm
from tarpo.training import trainer as trainer_module
from tarpo.training.preemption import SaveOnSignal
from tarpo.training.trainer import TarpoTrainer


def trainer_of(tokenizer, tmp_path, **overrides):
    args = make_args(tmp_path, **{"max_steps": 3, "save_on_signals": ["SIGUSR1"],
                                  **overrides})
    return TarpoTrainer(model=tiny_causal_lm(tokenizer, "qwen2", seed=0), reward_funcs=letter_reward, args=args,
                        train_dataset=make_dataset(), processing_class=tokenizer)


def test_the_handlers_are_put_back_when_training_raises(tokenizer, tmp_path, monkeypatch):
    before = signal.getsignal(signal.SIGUSR1)
    trainer = trainer_of(tokenizer, tmp_path)

    def broken(*args, **kwargs):
        assert signal.getsignal(signal.SIGUSR1) != before  # installed while training
        raise RuntimeError("a broken forward")
    monkeypatch.setattr(trainer_module, "score_rollout", broken)
    with pytest.raises(RuntimeError, match="a broken forward"):
        trainer.train()
    assert signal.getsignal(signal.SIGUSR1) == before  # before: the trainer's handler stayed


class SignalAtStep(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGUSR1)


def test_a_second_train_call_after_a_signal_trains_to_its_end(tokenizer, tmp_path):
    """A retry in the same process (resume after the stop) trains its steps (before: the first signal was still
    held, and the retry stopped after its first step)."""
    trainer = trainer_of(tokenizer, tmp_path)
    trainer.add_callback(SignalAtStep(1))
    trainer.train()
    assert trainer.stop_signal.stopped_at == 1 and trainer.state.global_step == 1
    trainer.pop_callback(SignalAtStep)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.stop_signal.stopped_at is None and trainer.state.global_step == 3


def test_a_second_signal_goes_to_the_handler_there_before(monkeypatch):
    """The first signal is recorded; a copy of it (within DUPLICATE_S) is ignored; a second one later is handed to
    the handler that was there before (by default it ends the process)."""
    from tarpo.training import preemption

    seen, clock = [], [100.0]
    monkeypatch.setattr(preemption.time, "monotonic", lambda: clock[0])
    previous = {s: signal.signal(s, lambda signum, frame: seen.append(signum)) for s in (signal.SIGUSR1,
                                                                                          signal.SIGUSR2)}
    try:
        stop = SaveOnSignal(["SIGUSR1", "SIGUSR2"])
        stop.on_train_begin(None, None, None)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.received == "SIGUSR1" and seen == []  # the first: finish the step, save, stop
        clock[0] += preemption.DUPLICATE_S / 2
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == []  # a copy of the first (a process group's and a launcher's)
        clock[0] += preemption.DUPLICATE_S
        os.kill(os.getpid(), signal.SIGUSR2)
        assert seen == []  # another kind: the scheduler's next notice (SIGTERM after the early-warning USR1)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]  # the same again: not waiting for the checkpoint
        assert signal.getsignal(signal.SIGUSR1) is not stop._handle
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def test_a_rank_stopped_by_another_then_signalled_itself_does_not_fail():
    """A rank told to stop by another (the all-reduced flag) and then sent the signal itself records it."""
    stop = SaveOnSignal(["SIGUSR1"])
    stop.on_train_begin(None, None, None)
    try:
        stop.received = "a signal to another process"  # what on_step_end sets from the flag
        os.kill(os.getpid(), signal.SIGUSR1)  # before: AttributeError in the handler
        assert stop.received == "a signal to another process"
    finally:
        stop.restore()


def test_a_handler_python_did_not_install_is_put_back_as_the_default():
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        stop = SaveOnSignal(["SIGUSR2"])
        stop._previous = {signal.SIGUSR2: None}  # what signal.signal returns for a handler set outside Python
        stop.restore()  # before: TypeError
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_another_kind_of_signal_during_the_final_save_does_not_end_the_process(monkeypatch):
    """The launch's handlers (tarpo.runs.launch_signals) during the final save: USR1 is kept until the save is done;
    a TERM 5 s later (Slurm's next notice) changes nothing (before: it ended the process mid-save); the stop is then
    raised as Preempted naming the first."""
    import signal as signals

    from tarpo.runs import launch_signals

    clock = [100.0]
    monkeypatch.setattr(launch_signals.time, "monotonic", lambda: clock[0])
    before = {s: signals.getsignal(s) for s in (signals.SIGTERM, signals.SIGUSR1)}
    with launch_signals.LaunchSignals(("TERM", "USR1")) as launch:
        with pytest.raises(launch_signals.Preempted, match="SIGUSR1"):
            with launch.deferred():
                signals.raise_signal(signals.SIGUSR1)
                clock[0] += 5.0
                signals.raise_signal(signals.SIGTERM)  # another kind: kept, not a second request
                saved = True
        assert saved and launch.received == "SIGUSR1"
    assert {s: signals.getsignal(s) for s in before} == before  # the handlers there before are back


def test_a_command_run_inside_the_launch_keeps_the_launchs_handler(monkeypatch):
    """EVAL=1 in one process runs ``tarpo eval`` inside the launch (tarpo.runs.launch.evaluate): a SIGTERM there is
    the launch's Preempted (the marker, the line, status 75), not the plain command's exit (before: SystemExit(143):
    the command had put its own SIGTERM handler over the launch's)."""
    import signal as signals

    from tarpo import cli
    from tarpo.cli import table
    from tarpo.runs import launch_signals

    monkeypatch.setattr(table, "run", lambda args: signals.raise_signal(signals.SIGTERM) or 0)
    before = signals.getsignal(signals.SIGTERM)
    with launch_signals.LaunchSignals(("TERM", "USR1")):
        with pytest.raises(launch_signals.Preempted, match="SIGTERM"):
            cli.main(["table", "--paper"])
    assert signals.getsignal(signals.SIGTERM) == before
