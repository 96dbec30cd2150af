"""Imported only as a preload of the grading workers' forkserver (:mod:`tarpo.tasks.workers`).

The forkserver ends as soon as the process that started it is gone (SIGKILL included: its
parent changes), and each worker it forks ends by the kernel's parent-death signal as soon as
the forkserver does, even inside a long C-level call of math-verify that holds the GIL. Without
this, a killed ``tarpo grade`` left busy workers running for seconds.
"""

import os
import sys
import threading
import time

_PARENT = os.getppid()


def _exit_with_parent() -> None:
    while os.getppid() == _PARENT:
        time.sleep(0.1)
    os._exit(1)


if sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules:  # in the forkserver, nowhere else
    threading.Thread(target=_exit_with_parent, daemon=True, name="exit-with-parent").start()
