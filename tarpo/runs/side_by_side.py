"""The learning check's runs as processes (:mod:`tarpo.runs.learning_check`): ``python -m tarpo.runs.launch
<dataset>`` once per run, side by side, each with its share of the cores and its output in ``<out>/<algo>.log``,
stopped at a deadline or when this process is sent SIGTERM/SIGINT (:func:`run_side_by_side`); or the runs one after
another in this process (:func:`run_in_process`). An error or a signal leaves no process behind
(:func:`kill_running`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def run_side_by_side(envs: dict[str, dict], out: str, deadline: float | None, dataset: str = "arith"
                     ) -> dict[str, int | None]:
    """Start ``python -m tarpo.runs.launch <dataset>`` once per entry of ``envs`` (algo -> its variables), each with
    its share of the cores, and wait for all; stop the runs still going at ``deadline`` (``time.time()``) or when
    this process is sent SIGTERM/SIGINT. Returns each run's exit status: its own where it ended by itself (a crash
    stays a crash), None where this function stopped it."""
    threads = str(max(1, (os.cpu_count() or 1) // len(envs)))
    procs, logs, stopped = {}, [], set()
    try:
        for algo, variables in envs.items():
            logs.append(log := open(os.path.join(out, f"{algo}.log"), "w"))
            procs[algo] = subprocess.Popen([sys.executable, "-m", "tarpo.runs.launch", dataset], stdout=log,
                                           stderr=subprocess.STDOUT,
                                           env={**os.environ, "OMP_NUM_THREADS": threads, **variables})

        def stop(signum=None, _frame=None):
            for algo, p in procs.items():
                if p.poll() is None:
                    stopped.add(algo)
                    p.terminate()
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while any(p.poll() is None for p in procs.values()):
                if deadline is not None and time.time() > deadline and not stopped:
                    print(f"learning check: --max-seconds reached, stopping {', '.join(procs)}", flush=True)
                    stop()
                time.sleep(0.5)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    finally:
        kill_running(procs)  # an error here leaves no run behind
        for log in logs:
            log.close()
    return {algo: None if algo in stopped else p.returncode for algo, p in procs.items()}


def kill_running(procs: dict) -> None:
    """Kill and reap each of ``procs`` (name -> ``subprocess.Popen``) still running."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_in_process(envs: dict[str, dict], dataset: str = "arith") -> dict[str, int]:
    """The runs one after another in this process (``--processes 1``: tests, a one-core machine)."""
    from . import launch

    status = {}
    for algo, variables in envs.items():
        saved = {k: os.environ.get(k) for k in variables}
        os.environ.update(variables)
        try:
            status[algo] = launch.main([dataset])
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return status
