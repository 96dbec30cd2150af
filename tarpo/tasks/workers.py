"""A pool of worker processes with a hard wall-clock timeout per job.

math-verify times itself out with ``signal.alarm``, which works only in a main thread and
cannot interrupt long C-level work (a huge integer power inside sympy). Here each job runs
in a worker process's main thread; a job still running at its deadline gets its worker
killed (SIGKILL) and replaced, and counts as timed out. Jobs run in parallel across
workers; one hung answer costs at most ``timeout`` seconds and never blocks the others.

Workers are forked from a forkserver that preloads the grading modules, so a
replacement starts in milliseconds and never inherits the trainer's threads or CUDA state.
When the grading process dies, however it dies, the forkserver and its workers end within
a fraction of a second (:mod:`tarpo.tasks.forkserver_guard`).

    >>> with WorkerPool(workers=2, timeout=5) as pool:
    ...     [r.value for r in pool.map(abs, [(-1,), (2,)])]
    [1, 2]
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from multiprocessing.connection import wait
from typing import Any, Callable, NamedTuple

PRELOAD = ["tarpo.tasks.math_grading", "tarpo.tasks.forkserver_guard"]
STARTUP_TIMEOUT = 300.0  # seconds a new worker may take to import before its first job
MAIN_MODULE_HINT = (
    "grading workers die as soon as they start. If this runs from a script, put its top-level code under "
    "`if __name__ == '__main__':` (workers are started with multiprocessing's forkserver, which imports the "
    "main module).")


class JobResult(NamedTuple):
    value: Any = None
    timed_out: bool = False
    error: str | None = None


def _die_with_forkserver() -> None:
    """Linux: SIGKILL this worker when its parent, the forkserver, exits (which it does when the
    grading process is gone: :mod:`tarpo.tasks.forkserver_guard`)."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the forkserver was gone before the call
        os._exit(1)


def _serve(conn) -> None:
    _die_with_forkserver()
    conn.send("ready")  # imports are done: a job's timeout counts from here, not from process start
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        fn, args = job
        try:
            conn.send(JobResult(fn(*args)))
        except Exception as exc:  # reported, never fatal to the worker
            conn.send(JobResult(error=f"{type(exc).__name__}: {exc}"[:500]))


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False

    def wait_ready(self) -> None:
        """Block until the worker has started (untimed by the job timeout; a new worker
        re-imports the main module, which can take seconds)."""
        if self.ready:
            return
        if not self.conn.poll(STARTUP_TIMEOUT):
            self.kill()
            raise RuntimeError(f"a grading worker did not start within {STARTUP_TIMEOUT:.0f} s")
        try:
            self.conn.recv()
        except (EOFError, OSError):
            raise RuntimeError(MAIN_MODULE_HINT) from None
        self.ready = True

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


class WorkerPool:
    def __init__(self, workers: int = 2, timeout: float = 10.0):
        if workers < 1 or timeout <= 0:
            raise ValueError(f"WorkerPool needs workers >= 1 and timeout > 0, got {workers}, {timeout}")
        self.timeout = timeout
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(PRELOAD)
        self._workers = [_Worker(self._ctx) for _ in range(workers)]
        self.timeouts = 0  # jobs killed at their deadline, over the pool's life
        self._deaths_in_a_row = 0

    def map(self, fn: Callable, jobs: list[tuple]) -> list[JobResult]:
        """``fn(*args)`` for each ``args`` in ``jobs``, in order; ``fn`` must be importable."""
        results: list[JobResult | None] = [None] * len(jobs)
        pending = deque(enumerate(jobs))
        idle = deque(range(len(self._workers)))
        busy: dict[int, tuple[int, float]] = {}  # worker index -> (job index, deadline)
        while pending or busy:
            while pending and idle:
                w = idle.popleft()
                j, args = pending.popleft()
                self._workers[w].wait_ready()
                self._workers[w].conn.send((fn, args))
                busy[w] = (j, time.monotonic() + self.timeout)
            next_deadline = min(d for _, d in busy.values())
            ready = wait([self._workers[w].conn for w in busy], timeout=max(0.0, next_deadline - time.monotonic()))
            for w in list(busy):
                j, deadline = busy[w]
                if self._workers[w].conn in ready:
                    try:
                        results[j] = self._workers[w].conn.recv()
                        self._deaths_in_a_row = 0
                    except (EOFError, OSError):  # the worker died (e.g. out of memory)
                        results[j] = JobResult(error="worker died")
                        self._deaths_in_a_row += 1
                        if self._deaths_in_a_row > 2 * len(self._workers):
                            raise RuntimeError(MAIN_MODULE_HINT) from None
                        self._replace(w)
                elif time.monotonic() >= deadline:
                    results[j] = JobResult(timed_out=True)
                    self.timeouts += 1
                    self._replace(w)
                else:
                    continue
                del busy[w]
                idle.append(w)
        return results  # type: ignore[return-value]

    def _replace(self, w: int) -> None:
        self._workers[w].kill()
        self._workers[w] = _Worker(self._ctx)

    def close(self) -> None:
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except OSError:
                pass
            worker.proc.join(timeout=1)
            if worker.proc.is_alive():
                worker.kill()
        self._workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_shared: dict[tuple[int, float], WorkerPool] = {}


def shared_pool(workers: int, timeout: float) -> WorkerPool:
    """One long-lived pool per (workers, timeout), closed at interpreter exit."""
    key = (workers, timeout)
    if key not in _shared:
        _shared[key] = WorkerPool(workers, timeout)
    return _shared[key]


@atexit.register
def _close_shared() -> None:
    for pool in _shared.values():
        pool.close()
    _shared.clear()
