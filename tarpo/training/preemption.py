"""A run stopped by a signal ends with a complete checkpoint (docs/design-notes.md, "Preemption and non-finite steps").

A scheduler that preempts a job (Slurm's ``scancel`` or the end of its time, Kubernetes' eviction) sends SIGTERM, and
some send an early warning first (Slurm's ``--signal=USR1@120``). :class:`SaveOnSignal` turns each signal of
``TarpoConfig.save_on_signals`` into "finish the optimizer step in flight, write a checkpoint, stop": the handler only
records the signal (the save is atomic anyway: tarpo.training.checkpoints), and at the end of the step every process
stops at the same step (the processes agree over one all-reduce of a flag a step, when there are several), the Trainer
saves ``checkpoint-N`` and training returns; the same signal again meanwhile is handed to the handler that was there
before (by default it ends the process), so a step or save that is slow in Python can be stopped without SIGKILL (not
one waiting inside a single C call: an NCCL collective, a stuck ``.item()``, a hung write; Python runs handlers only
between bytecodes). The same signal within
:data:`DUPLICATE_S` of the first is taken for a copy of it (a scheduler signals the whole process group, and a
launcher may forward it too); another kind (Slurm's SIGTERM after its early-warning USR1) is the scheduler's next
notice and changes nothing. The launcher then says so in one line and exits with :data:`EXIT_PREEMPTED` (75, sysexits'
EX_TEMPFAIL: try again), a status a requeue can be keyed on; running the same command again resumes from the
checkpoint and trains what an uninterrupted run trains.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

import torch
from transformers import TrainerCallback

from ..atomic_files import write_json_atomic
from ..engineering_fields import signal_numbers
from .distributed import on_any_rank

logger = logging.getLogger(__name__)
EXIT_PREEMPTED = 75  # sysexits.h EX_TEMPFAIL: a temporary failure, the command may be run again
DUPLICATE_S = 2.0  # a signal within this many seconds of the first is a copy of it, not a second request
MARKER = "preempted.json"  # in the run folder while its last launch was stopped by a signal (tarpo.runs.launch)


def any_process(flag: bool) -> bool:
    """``flag`` or'ed over the processes of a distributed run (one all-reduce of one number); ``flag`` alone."""
    return bool(on_any_rank(torch.tensor(flag)))


def install(signals, handler) -> dict:
    """``handler`` for each of ``signals``; returns the handlers there were before (for :func:`put_back`)."""
    return {s: signal.signal(s, handler) for s in signals}


def put_back(previous: dict) -> None:
    """The handlers :func:`install` returned, put back; one that Python did not install (``signal.signal`` gave
    None) as the default one."""
    for s, handler in previous.items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def asks_again(first: tuple, signum: int, now: float) -> bool:
    """Whether ``signum`` at ``now`` (monotonic seconds), after the first signal ``first`` = ``(number, time)``, is a
    second request to stop at once: the same kind, :data:`DUPLICATE_S` or more later. Within that it is a copy of
    the first (a process group's and a launcher's); another kind (a scheduler's SIGTERM after its early-warning
    USR1) is its next notice."""
    return signum == first[0] and now - first[1] >= DUPLICATE_S


class SaveOnSignal(TrainerCallback):
    """Stop at the end of the step in flight, with a checkpoint, when one of ``signals`` arrives (handlers set
    while training, the previous ones put back after). ``received``: the first signal's name; ``stopped_at``: the
    step training stopped after (None: it was not stopped)."""

    def __init__(self, signals):
        self.signals, self.received, self.stopped_at, self._previous = signal_numbers(signals), None, None, {}
        self._first = None  # (signal number, time) of the first signal this process received

    def _handle(self, signum, _frame):
        now = time.monotonic()
        if self.received is None or self._first is None:  # the first one here: finish the step, save, stop
            self.received = self.received or signal.Signals(signum).name
            self._first = (signum, now)
            return
        if not asks_again(self._first, signum, now):
            return
        # a second one (a step or a save that hangs): the usual "second signal forces" rule, the handler that was
        # there before takes it (the default one ends the process)
        logger.warning(f"{signal.Signals(signum).name} again: not waiting for the checkpoint")
        self.restore()
        signal.raise_signal(signum)

    def on_train_begin(self, args, state, control, **kwargs):
        self.received, self.stopped_at, self._first = None, None, None  # each train() call starts afresh
        if threading.current_thread() is not threading.main_thread():
            logger.warning("training outside the main thread: a signal cannot stop it with a checkpoint")
            return
        self._previous = install(self.signals, self._handle)

    def restore(self) -> None:
        """Put back the handlers there were before training (idempotent; TarpoTrainer.train calls it on every way
        out, an exception included; :func:`put_back`)."""
        previous, self._previous = self._previous, {}
        put_back(previous)

    def on_step_end(self, args, state, control, **kwargs):
        if any_process(self.received is not None):
            self.received = self.received or "a signal to another process"
            self.stopped_at = state.global_step
            control.should_save = control.should_training_stop = True
            if state.is_world_process_zero:
                logger.warning(f"{self.received}: step {state.global_step} done, saving checkpoint-"
                               f"{state.global_step} and stopping")

    def on_train_end(self, args, state, control, **kwargs):
        self.restore()


def record_stop(run_dir: str, signal_name: str, step: int | None, saved: str | None = None, when: str | None = None,
                then: str = "resume from it") -> None:
    """Leave :data:`MARKER` in ``run_dir``: its last launch stopped at ``signal_name``: after optimizer step ``step``
    with ``checkpoint-<step>`` saved (the default), or ``when`` it says (``"before training ended"``, ``"after
    training"``, ...) with ``saved`` complete (None: nothing new was saved) and ``then`` what the same command does
    again. Written by each machine's first process (the folder may not be shared between machines)."""
    if when is None:
        when, saved = f"after step {step}", os.path.join(run_dir, f"checkpoint-{step}")
    write_json_atomic(os.path.join(run_dir, MARKER), {"signal": signal_name, "step": step, "when": when,
                                                      "saved": saved, "then": then})


def clear_stop(run_dir: str) -> None:
    """A new launch into ``run_dir``: the marker of an earlier stop goes."""
    try:
        os.remove(os.path.join(run_dir, MARKER))
    except FileNotFoundError:
        pass


def stop_line(run_dir: str) -> str | None:
    """The one line a launcher prints when its run was stopped by a signal (None: it was not)."""
    try:
        with open(os.path.join(run_dir, MARKER)) as f:
            stop = json.load(f)
    except (OSError, ValueError):
        return None
    return describe_stop(stop)


def describe_stop(stop: dict) -> str:
    """The launcher's line of a stop (:func:`record_stop`'s fields)."""
    saved = f"{stop['saved']} is complete" if stop.get("saved") else "nothing new was saved"
    return (f"tarpo launch: stopped by {stop['signal']} {stop['when']}: {saved}; run the same command again to "
            f"{stop['then']} (exit status {EXIT_PREEMPTED})")
