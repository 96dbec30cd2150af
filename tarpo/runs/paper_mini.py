"""The paper's tables and figures in miniature, on a real model and a CPU, from one resumable command.

Every system of the paper's Tables 1 and 5 on SmolLM2-135M-Instruct (``python -m tarpo.models.offline
smollm2-135m`` first), on the same data and budget (docs/paper-mini.md says what was chosen and why):

- **training-free**: CoT, Pure Latent and Entropy-Routed (the base model under each inference mode);
- **trained**, each a launcher run (``python -m tarpo.runs.launch arith_one`` with its ``ALGO``) at the real-model
  check's settings (:data:`tarpo.runs.learning_check.REAL_MODELS`), once per seed: GRPO, GRPO w/ Pure Latent,
  GRPO w/ Entropy Routing, HRPO, Soft Tokens and TARPO, each evaluated in its own mode, and TARPO's model with
  hard inference too;
- **the figures of §5.4** (first seed only): TARPO at three initial biases b0 without action KL (the paper's panels
  a and b), and with the action KL on and off at b0 = [2.2, 0] with beta > 0 (panel c).

Each evaluation is ``tarpo eval`` on ``--questions`` held-out questions of each column (``arith_one``, the task
trained on; ``arith_two``, a step more of reasoning) with ``--n`` samples each. Two jobs run side by side, one
thread each. A job already finished is skipped when the command runs again; a killed training run resumes from its
last checkpoint (``SAVE_STEPS``) and a killed evaluation from its last complete chunk. One line is printed as each
job ends, with the time the rest is estimated to take. At the end (and with ``--report-only``) the report:
``<out>/paper_mini.json``, ``<out>/tables.md`` and the PNG figures (:mod:`tarpo.runs.paper_mini_report`).

    python -m tarpo.runs.paper_mini                          # seeds 0,1,2 into runs/paper-mini
    python -m tarpo.runs.paper_mini --seeds 0                # one seed of Tables 1/5 and the figures
    python -m tarpo.runs.paper_mini --report-only            # the report of what has finished so far
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from ..atomic_files import write_json_atomic
from .learning_check import REAL_MODELS
from .paper_mini_plan import PRIOR_SECONDS, Job, Settings, plan
from .side_by_side import kill_running

STOPS = (signal.SIGTERM, signal.SIGINT)  # the command's stop signals
SETTINGS_FILE = "paper_mini_settings.json"  # in --out: the settings its jobs ran with (settings_record)
STOP_GRACE_S = 150.0  # a stop signal's wait for the running jobs to save (a training step is about 45 s here)

def estimate_left(jobs: list[Job], s: Settings) -> float:
    """Seconds the jobs not yet ended are estimated to take (a running one at its full length), ``s.slots`` at a
    time: each at the mean of its kind's jobs that ended complete this time (else :data:`PRIOR_SECONDS`).

    >>> j = [Job("a", "train", [], {}, "", seconds=1000.0, ok=True), Job("b", "train", [], {}, ""),
    ...      Job("c", "eval", [], {}, ""), Job("d", "eval", [], {}, "", seconds=5.0)]  # d failed: not a measure
    >>> estimate_left(j, Settings(slots=2))
    680.0
    """
    def mean(kind):
        times = [j.seconds for j in jobs if j.kind == kind and j.ok]
        return sum(times) / len(times) if times else PRIOR_SECONDS[kind]
    return sum(mean(j.kind) for j in jobs if j.seconds is None) / s.slots


class Stopped(Exception):
    """A stop signal reached the command (SIGTERM, SIGINT)."""


class _StopFlag:
    """The stop signals' handler: the first is noted (the scheduler's loop stops the jobs at its next turn, so that
    no exception lands between a job's start and its being held); the same request again interrupts that stop and
    kills the jobs at once."""

    def __init__(self):
        self.signum = None

    def __call__(self, signum, _frame):
        if self.signum is None:
            self.signum = signum
            return
        raise Stopped(signum)


def _signal_group(proc, sig) -> None:
    """``sig`` to a job's process group (each job is a session of its own: the launcher and what it started)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_jobs(procs: dict) -> None:
    """Kill and reap each job still running, its process group with it."""
    for proc in procs.values():
        if proc.poll() is None:
            _signal_group(proc, signal.SIGKILL)
    kill_running(procs)


def stop_running(procs: dict, grace: float = STOP_GRACE_S) -> None:
    """Ask each running job to stop (SIGTERM to its process group: a training run saves a checkpoint at the end of
    its step, an evaluation keeps its complete chunks), wait up to ``grace`` seconds for them, then kill what still
    runs."""
    try:
        for proc in procs.values():
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.time() + grace
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
    finally:  # a second signal while waiting: kill at once
        kill_jobs(procs)


def code_version() -> str:
    """The checkout's commit (``-dirty`` with uncommitted changes to tracked files), or ``unknown`` outside git."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=here).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def _start(job: Job, s: Settings, threads: str):
    os.makedirs(os.path.join(s.out, "logs"), exist_ok=True)
    log = open(os.path.join(s.out, "logs", job.name.replace("/", "-") + ".log"), "a")
    log.write(f"# {job.name}: started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} at commit "
              f"{code_version()}\n")
    log.flush()
    # a session of its own: a terminal's Ctrl-C reaches this command alone, which asks the jobs to stop with SIGTERM
    # (the signal a launcher saves a checkpoint on), instead of reaching every job as SIGINT
    proc = subprocess.Popen(job.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": threads, **job.env})
    return job, proc, log, time.time()


def run_jobs(jobs: list[Job], s: Settings) -> dict[str, int]:
    """Run the jobs not yet done, ``s.slots`` side by side (one thread each), each when the jobs it needs have
    finished; print a line as each ends. Returns each failed job's exit status (a job that needs a failed one is not
    started). A stop signal (SIGTERM, SIGINT) stops the running jobs as :func:`stop_running` does and raises
    :class:`Stopped` (a second one kills them at once); an error kills them; the finished jobs stay done."""
    threads = str(max(1, (os.cpu_count() or 1) // s.slots))
    todo = [j for j in jobs if not os.path.isfile(j.done_file)]
    skipped = len(jobs) - len(todo)
    print(f"paper-mini: {len(jobs)} jobs, {skipped} done already, {len(todo)} to run into {s.out} "
          f"(about {estimate_left(todo, s) / 60:.0f} min at the prior times)", flush=True)
    running, failed, finished = {}, {}, {j.name for j in jobs if os.path.isfile(j.done_file)}
    stop = _StopFlag()
    previous = {n: signal.signal(n, stop) for n in STOPS}
    try:
        while todo or running:
            for job in list(todo):
                if len(running) >= s.slots:
                    break
                if any(a in failed for a in job.after):
                    todo.remove(job)
                    failed[job.name] = -1
                elif all(a in finished for a in job.after):
                    todo.remove(job)
                    running[job.name] = _start(job, s, threads)
            time.sleep(1.0)
            if stop.signum is not None:
                stop_running({n: p for n, (_, p, _, _) in running.items()})
                raise Stopped(stop.signum)
            for name, (job, proc, log, started) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[name]
                job.seconds = time.time() - started
                ok = job.ok = proc.returncode == 0 and os.path.isfile(job.done_file)
                if ok:
                    finished.add(name)
                else:
                    failed[name] = proc.returncode
                left = estimate_left([j for j in jobs if j.ok or (j.name not in finished | set(failed))], s)
                count = sum(j.seconds is not None for j in jobs)
                print(f"[{count}/{len(jobs) - skipped}] {name}: {'done' if ok else f'FAILED (exit {proc.returncode})'}"
                      f" in {job.seconds / 60:.1f} min; about {left / 60:.0f} min left", flush=True)
    finally:  # the handlers first (a signal now changes nothing), then no job left running
        for n, handler in previous.items():
            signal.signal(n, handler)
        kill_jobs({n: p for n, (_, p, _, _) in running.items()})
    return failed


def settings_record(s: Settings) -> dict:
    """What decides the jobs' results (not ``seeds``, ``slots``, ``figures``: a later run may add seeds or figures)."""
    return {"model": s.model, "steps": s.steps, "questions": s.questions, "n": s.n}


def check_same_settings(s: Settings) -> None:
    """A folder's finished jobs are skipped by name, so a run with other settings into it would mix results: refused,
    naming each difference, before anything runs or is written."""
    path = os.path.join(s.out, SETTINGS_FILE)
    if not os.path.isfile(path):
        return
    with open(path) as f:
        recorded = json.load(f)
    now = settings_record(s)
    diff = [f"--{k} {now[k]} (the folder's: {recorded.get(k)})" for k in now if recorded.get(k) != now[k]]
    if diff:
        raise ValueError(f"--out {s.out} holds jobs run with other settings: {'; '.join(diff)}; use another --out, "
                         "or the folder's settings to go on")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=Settings.model, choices=sorted(REAL_MODELS))
    ap.add_argument("--out", default=Settings.out)
    ap.add_argument("--seeds", default=",".join(map(str, Settings.seeds)), help="comma-separated training seeds")
    ap.add_argument("--steps", type=int, default=Settings.steps, help="RL steps of each training run")
    ap.add_argument("--questions", type=int, default=Settings.questions, help="held-out questions of each column")
    ap.add_argument("--n", type=int, default=Settings.n, help="samples per question (pass@n is the table's P@k)")
    ap.add_argument("--slots", type=int, default=Settings.slots, help="jobs side by side")
    ap.add_argument("--no-figures", action="store_true", help="leave out the §5.4 figures' runs")
    ap.add_argument("--report-only", action="store_true", help="write the report of what has finished; run nothing")
    return ap.parse_args(argv)


def settings_from(args) -> Settings:
    """The settings of the flags; a bad value is refused naming its flag, before anything runs or is written."""
    try:
        seeds = tuple(int(v) for v in args.seeds.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--seeds {args.seeds!r}: comma-separated integers") from None
    for flag, value in (("--seeds", len(seeds)), ("--steps", args.steps), ("--questions", args.questions),
                        ("--n", args.n), ("--slots", args.slots)):
        if value < 1:
            raise ValueError(f"{flag}: must be at least 1")
    return Settings(args.model, os.path.abspath(args.out), seeds, args.steps, args.questions, args.n, args.slots,
                    not args.no_figures)


def main(argv=None) -> int:
    from .paper_mini_report import write_report

    args = parse_args(argv)
    try:
        s = settings_from(args)
    except ValueError as exc:
        print(f"paper-mini: {exc}", file=sys.stderr)
        return 2
    failed = {}
    if not args.report_only:
        try:
            check_same_settings(s)
        except ValueError as exc:
            print(f"paper-mini: {exc}", file=sys.stderr)
            return 2
        os.makedirs(s.out, exist_ok=True)
        write_json_atomic(os.path.join(s.out, SETTINGS_FILE), settings_record(s))
        try:
            failed = run_jobs(plan(s), s)
        except Stopped as stop:
            print(f"paper-mini: stopped by signal {stop.args[0]}; the finished jobs are kept and the stopped ones "
                  "saved where they could: run the same command again to go on", flush=True)
            return 75
    summary = write_report(s, plan(s))
    print(json.dumps({"out": s.out, "failed": failed, "jobs_done": summary["jobs_done"]}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    from ..process_exit import skip_the_final_collection
    skip_the_final_collection()
    sys.exit(main())
