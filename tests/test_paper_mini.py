"""The miniature paper command (tarpo.runs.paper_mini): its plan covers every system of Tables 1 and 5 and the
figures' runs, its scheduler skips what is done and resumes the rest, and its report computes what it says from the
files the runs leave (metrics.jsonl, results.json, trajectories)."""

import json
import os
import sys

import pytest

from tarpo.algorithms import ALGOS
from tarpo.runs import paper_mini, paper_mini_report
from tarpo.runs.paper_mini import run_jobs
from tarpo.runs.paper_mini_plan import (EVAL_TASKS, FIGURE_RUNS, HARD_INFERENCE, TRAINED, TRAINING_FREE, Job, Settings,
                                        eval_label, plan)


def test_the_plan_holds_every_system_once_per_seed(tmp_path):
    jobs = plan(Settings(out=str(tmp_path), seeds=(0, 1, 2)))
    names = [j.name for j in jobs]
    assert len(names) == len(set(names)) and len({j.done_file for j in jobs}) == len(jobs)
    for seed in (0, 1, 2):
        for algo in TRAINED:
            assert f"train/{algo}-s{seed}" in names
            ev = next(j for j in jobs if j.name == eval_label(ALGOS[algo].system, seed).join(("eval/", "")))
            assert ev.after == (f"train/{algo}-s{seed}",) and ev.command[ev.command.index("--mode") + 1] == \
                ALGOS[algo].eval_mode
        hard = next(j for j in jobs if j.name == f"eval/{eval_label(HARD_INFERENCE, seed)}")
        assert hard.command[hard.command.index("--mode") + 1] == "hard" and hard.after == (f"train/tarpo-s{seed}",)
    for system, mode in TRAINING_FREE:  # evaluated once: no training seed
        assert names.count(f"eval/{eval_label(system, None)}") == 1
    for figure in FIGURE_RUNS:  # the figures' runs on the first seed only
        assert f"train/{figure}-s0" in names and f"train/{figure}-s1" not in names
    every = next(j for j in jobs if j.name == "train/tarpo-s1").env
    assert every["SEED"] == "1" and every["ALGO"] == "tarpo" and every["MICRO_BATCH"] == "8"
    assert next(j for j in jobs if j.name == "train/tarpo-alpha=1-s0").env["BETA"] != "0"
    ev = next(j for j in jobs if j.name == "eval/CoT")
    assert ev.command[ev.command.index("--tasks") + 1] == ",".join(EVAL_TASKS)


def fake_job(tmp_path, name, after=(), fail=False):
    done = tmp_path / f"{name}.done"
    code = "import sys; sys.exit(3)" if fail else f"open({str(done)!r}, 'w').write('x'); print('ran {name}')"
    return Job(name, "eval", [sys.executable, "-c", code], {}, str(done), after=after)


def test_the_scheduler_skips_what_is_done_and_never_starts_what_needs_a_failure(tmp_path, capsys):
    s = Settings(out=str(tmp_path), slots=2)
    jobs = [fake_job(tmp_path, "a"), fake_job(tmp_path, "b", after=("a",)), fake_job(tmp_path, "c", fail=True),
            fake_job(tmp_path, "d", after=("c",))]
    failed = run_jobs(jobs, s)
    assert failed == {"c": 3, "d": -1}
    assert (tmp_path / "a.done").exists() and (tmp_path / "b.done").exists() and not (tmp_path / "d.done").exists()
    out = capsys.readouterr().out
    assert "c: FAILED (exit 3)" in out and "min left" in out
    (tmp_path / "logs" / "a.log").unlink()
    failed = run_jobs([fake_job(tmp_path, "a"), fake_job(tmp_path, "b", after=("a",))], s)  # again: nothing runs
    assert failed == {} and not (tmp_path / "logs" / "a.log").exists()
    assert "2 done already, 0 to run" in capsys.readouterr().out


def test_bad_flags_are_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "pm"
    assert paper_mini.main(["--out", str(out), "--seeds", "0,x"]) == 2
    assert paper_mini.main(["--out", str(out), "--n", "0"]) == 2
    assert "--seeds" in capsys.readouterr().err and not out.exists()


def write_eval(folder, task, scores, completions, n=4):
    """A results file and its trajectories as tarpo eval writes them (the fields the report reads)."""
    os.makedirs(folder, exist_ok=True)
    records = [{"id": f"q{i // n}", "sample": i % n, "score": s, "completion": c, "actions": "hs-",
                "p_soft": [0.2, 0.7, 0], "tokens": [1, 2, 3]} for i, (s, c) in enumerate(zip(scores, completions))]
    with open(os.path.join(folder, f"{task}.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    per_q = [sum(scores[q * n:(q + 1) * n]) / n for q in range(len(scores) // n)]
    metrics = {"pass@1": sum(per_q) / len(per_q), f"pass@{n}": sum(v > 0 for v in per_q) / len(per_q),
               "accuracy_ci95": 0.1, "units": 3.0, "soft_ratio": 1 / 3, "questions": len(per_q)}
    with open(os.path.join(folder, f"{task}.results.json"), "w") as f:
        json.dump({"metrics": metrics, "trajectories": f"{task}.jsonl"}, f)


def write_run(folder, rewards, p_soft):
    os.makedirs(os.path.join(folder, "adapter"), exist_ok=True)
    open(os.path.join(folder, "adapter", "final_state.json"), "w").write("{}")
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        for step, (r, p) in enumerate(zip(rewards, p_soft), 1):
            f.write(json.dumps({"step": step, "reward": r, "router/p_soft": p, "entropy": 1.0 / step,
                                "soft_ratio": p, "timing/step_s": 10.0}) + "\n")


def test_the_report_computes_its_figures_from_the_files(tmp_path, monkeypatch):
    s = Settings(out=str(tmp_path), seeds=(0, 1), figures=True)
    good, bad = "3+4=7 #### 7", "3+4=7 #### 7 #### 7"  # right, and right but with two tags (reward 0)
    write_eval(tmp_path / "eval" / "CoT", "arith_one", [1, 0, 0, 0, 0, 0, 0, 0], [good] * 8)
    for seed, scores in ((0, [1, 1, 1, 1, 1, 0, 0, 0]), (1, [1, 1, 1, 0, 1, 1, 0, 0])):
        write_eval(tmp_path / "eval" / f"GRPO-s{seed}", "arith_one", scores, [good] * 8)
        write_eval(tmp_path / "eval" / f"TARPO-s{seed}", "arith_one", scores, [bad] * 4 + [good] * 4)
        write_run(tmp_path / "train" / f"tarpo-s{seed}", [0.1 * i for i in range(10)], [0.1] + [0.3] * 9)
    write_run(tmp_path / "train" / "tarpo-b0=4.6-s0", [0.0] * 10, [0.01] * 10)
    monkeypatch.setattr(paper_mini_report, "token_decoder", lambda model: {1: "7", 2: "+", 3: " "}.get)
    summary = paper_mini_report.write_report(s, plan(s))
    tarpo = summary["systems"]["TARPO"]["arith_one"]
    assert tarpo["pass@1"]["mean"] == pytest.approx((5 / 8 + 5 / 8) / 2)
    assert tarpo["reward@1"]["mean"] == pytest.approx((1 / 8 + 1 / 4) / 2)  # the two-tag samples earn no reward
    assert summary["systems"]["GRPO"]["arith_one"]["reward@1"]["mean"] == tarpo["pass@1"]["mean"]
    vs_base = summary["comparisons"]["TARPO vs CoT on arith_one"]
    # exact: both seeds' differences are the same number, whose SD is 0
    assert vs_base["difference"] == pytest.approx(5 / 8 - 1 / 8) and vs_base["seeds_sd"] == 0
    # exact: GRPO's and TARPO's pass@1 are read from the same scores
    assert summary["comparisons"]["TARPO vs GRPO on arith_one"]["difference"] == 0
    run = summary["runs"]["tarpo-s0"]
    assert (run["p_soft_start"], run["p_soft_end"]) == (0.1, pytest.approx(0.3)) and run["learns"] is True
    digits = summary["where_soft"]["kind:digit"]
    assert digits == {"steps": 8 * 2, "soft_share": 0.0, "mean_p_soft": pytest.approx(0.2)}
    assert summary["where_soft"]["position:1-4"]["steps"] == 8 * 2 * 2
    assert {"b0_soft_ratio.png", "b0_reward.png"} <= set(summary["figures"]["written"])
    assert json.load(open(tmp_path / "figures.json"))["b0"]["4.6"]["soft_ratio"] == [0.01] * 10
    table = (tmp_path / "tables.md").read_text()
    assert "| TARPO | 62.5 ± 0.0 |" in table and "| GRPO w/ Pure Latent | – |" in table


def test_a_stop_signal_stops_the_running_jobs_and_leaves_none(tmp_path):
    """SIGTERM to the command reaches each running job as SIGTERM (a launcher run saves a checkpoint then), the
    command ends with 75, and no job is left running. The job here records the signal and exits as a launcher does."""
    import signal
    import subprocess
    import time

    marker, pidfile = tmp_path / "job-got-sigterm", tmp_path / "job.pid"
    job_code = (f"import os, signal, sys, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
                f"signal.signal(signal.SIGTERM, lambda *a: (open({str(marker)!r}, 'w').write('x'), sys.exit(75))); "
                "time.sleep(60)")
    driver = (f"import sys; from tarpo.runs import paper_mini; from tarpo.runs.paper_mini_plan import Job, Settings; "
              f"s = Settings(out={str(tmp_path)!r}); "
              f"job = Job('j', 'train', [sys.executable, '-c', {job_code!r}], {{}}, {str(tmp_path / 'never')!r}); "
              "paper_mini.plan = lambda s: [job]; "
              "paper_mini.write_report = None; "
              "sys.exit(paper_mini.main(['--out', s.out]))")
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75 and "stopped by signal" in out
    assert marker.exists()  # the job was asked to stop, not killed
    job_pid = int(pidfile.read_text())
    assert not os.path.exists(f"/proc/{job_pid}") or open(f"/proc/{job_pid}/stat").read().split()[2] == "Z"


def test_a_folder_run_with_other_settings_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    """Finished jobs are skipped by name: a run with another --steps into the same folder would mix results."""
    out = tmp_path / "pm"
    monkeypatch.setattr(paper_mini, "run_jobs", lambda jobs, s: {})
    monkeypatch.setattr(paper_mini_report, "write_report", lambda s, jobs: {"jobs_done": 0})
    assert paper_mini.main(["--out", str(out), "--steps", "30"]) == 0
    assert paper_mini.main(["--out", str(out), "--steps", "20"]) == 2
    assert "--steps 20 (the folder's: 30)" in capsys.readouterr().err


def test_a_comparison_without_a_seed_of_both_is_left_out():
    assert paper_mini_report.compare({0: 0.5}, {1: 0.4}, 0.1, 0.1) is None
