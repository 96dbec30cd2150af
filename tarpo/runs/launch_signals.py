"""A stop signal outside training ends the launch with the requeue status too (docs/design-notes.md, "Preemption and
non-finite steps").

While training, :class:`tarpo.training.preemption.SaveOnSignal` turns a signal of ``SAVE_ON_SIGNALS`` into "finish the
step, save, stop". Around it a launch also loads the model, compiles, reads its checkpoint, saves the final adapter
and, with ``EVAL=1``, evaluates. :class:`LaunchSignals` holds the same signals for all of that:

- before training ends (a load, a compile, a checkpoint read; a second signal that SaveOnSignal hands on), and during
  the evaluation: :class:`Preempted` is raised at once; every file the launch writes is written whole or not at all
  (checkpoints, the adapter, the evaluation's chunks), so nothing is left half-written;
- during the final save (:meth:`LaunchSignals.deferred`): the save finishes first, then the launch stops before
  ``EVAL=1``; the same signal asked again (:func:`tarpo.training.preemption.asks_again`) ends the process
  (another kind, e.g. Slurm's SIGTERM after its USR1, changes nothing);
- a copy of the first signal (a process group's and a launcher's) changes nothing.

The launcher then leaves the marker, prints its one line (what is complete, what the same command does again) and
exits with status 75, as after a stop at a step.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

from ..engineering_fields import signal_numbers
from ..training.preemption import asks_again, install, put_back


class Preempted(BaseException):
    """A stop signal outside a training step (raised by :class:`LaunchSignals`). A ``BaseException``, as
    ``KeyboardInterrupt``: no ``except Exception`` on its way swallows it."""


class LaunchSignals:
    """``with LaunchSignals(signals) as signals:`` the launch's handlers of ``signals`` (``TarpoConfig
    .save_on_signals``; none: nothing is installed); ``received``: the first signal's name."""

    def __init__(self, signals):
        self.signals, self.received, self._first, self._defer, self._previous = signal_numbers(signals), None, \
            (0, 0.0), False, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = install(self.signals, self._handle)
        return self

    def __exit__(self, *exc):
        previous, self._previous = self._previous, {}
        put_back(previous)

    def _handle(self, signum, _frame):
        now = time.monotonic()
        if self.received is None:
            self.received, self._first = signal.Signals(signum).name, (signum, now)
            if not self._defer:
                raise Preempted(self.received)
            return
        if self._defer and asks_again(self._first, signum, now):  # during the save, asked again: it hangs; end it
            self.__exit__()
            signal.raise_signal(signum)

    @contextlib.contextmanager
    def deferred(self):
        """Within: a signal is recorded, not raised (the final save finishes); raised as :class:`Preempted` after."""
        self._defer = True
        try:
            yield
        finally:
            self._defer = False
        if self.received is not None:
            raise Preempted(self.received)
