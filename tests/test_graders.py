import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import DATA, needs_data, score
from tarpo.tasks.answers import last_boxed
from tarpo.tasks.graders import canonical_answers, grade_batch, multiple_choice_letter, reward_function
from tarpo.tasks.registry import load_task



def ex(gold, task="math500", **extra):
    return {"gold": gold, "task": task, **extra}


@needs_data
def test_every_math500_solution_grades_correct_against_its_answer():
    ds = load_task("math500", os.path.join(DATA, "math500"), "test")
    with open(os.path.join(DATA, "math500", "test.jsonl")) as f:
        solutions = [json.loads(line)["solution"] for line in f]
    completions = [f"work shown here #### {last_boxed(s)}" for s in solutions]
    grades = grade_batch(completions, list(ds), "math_verify", reward=True, timeout=20)
    wrong = [(ds[i]["id"], ds[i]["gold"]) for i, g in enumerate(grades) if g.score != 1.0]
    assert wrong == [], f"{500 - len(wrong)}/500 correct"  # 500/500 on 2026-11-22, math-verify 0.9.0


@needs_data
def test_gsm8k_gold_in_another_form_is_correct_and_next_rows_answer_is_wrong():
    ds = list(load_task("gsm8k", os.path.join(DATA, "gsm8k"), "test"))
    golds = [e["gold"] for e in ds]

    def other_form(g):  # 1234 -> "$1,234.00", -5 -> "-5.0"
        value = float(g)
        return f"${value:,.2f}" if value >= 1000 else f"{value:.1f}"

    right = grade_batch([f"so #### {other_form(g)}" for g in golds], ds, "gsm8k")
    assert all(g.score == 1.0 for g in right)
    nxt = [golds[(i + 1) % len(golds)] for i in range(len(golds))]
    wrong = grade_batch([f"#### {n}" for n in nxt], ds, "gsm8k")
    assert all(g.score == (1.0 if a == b else 0.0) for g, a, b in zip(wrong, golds, nxt))
    assert sum(g.score for g in wrong) < 0.1 * len(ds)


def test_reward_rule_needs_exactly_one_tag_and_no_fallback():
    e = ex("\\frac{1}{2}")
    assert score("think #### 1/2", e, reward=True) == 1.0
    assert score("#### 2 #### 1/2", e, reward=True) == 0.0          # exact: a float(bool) score; two tags
    assert score("so \\boxed{1/2}", e, reward=True) == 0.0         # exact: a float(bool) score; no tag
    assert score("so \\boxed{1/2}", e) == 1.0                      # evaluation: boxed fallback
    assert score("the answer is 0.5", e) == 1.0                    # evaluation: last-number fallback
    assert score("the answer is 0.5", e, fallbacks=()) == 0.0  # exact: a float(bool) score
    assert score("#### 2 #### 1/2", e) == 1.0                      # evaluation: text after the last tag


def test_graders_on_hand_examples():
    assert score("#### 1,234", ex("1234", "gsm8k")) == 1.0
    # exact: a float(bool) score
    assert score("#### 1234.50", ex("1234", "gsm8k")) == 0.0
    assert score("#### $18", ex("18", "gsm8k"), grader="math_verify") == 1.0
    assert score("#### \\dfrac{3}{4}", ex("\\frac34"), grader="math_reference") == 1.0
    assert score("#### (C)", ex("C", "arc_challenge")) == 1.0
    # exact: a float(bool) score
    assert score("#### A or C", ex("C", "arc_challenge")) == 0.0
    assert multiple_choice_letter("\\boxed{B}") == "B"


def test_equivalent_answers_share_a_canonical_form():
    forms = canonical_answers(["1/2", "0.5", "\\frac{1}{2}", "\\dfrac12", "2/4", "0.25", None], "math500")
    assert len(set(forms[:5])) == 1 and forms[5] != forms[0] and forms[6] == ""
    assert canonical_answers(["1,000", "1000.0", "999"], "gsm8k")[:2] == ["1000", "1000"]


PATHOLOGICAL = ["9^9^9^9^9", "10^{10^{10}}", "100000!", "\\frac{1}{" * 50 + "2" + "}" * 50, "1" * 1_000_000,
                "(" * 5000 + "1" + ")" * 5000]


def test_pathological_answers_return_within_the_timeout():
    timeout = 2.0
    for answer in PATHOLOGICAL:
        start = time.monotonic()
        grade = grade_batch([f"#### {answer}"], [ex("7")], "math_verify", timeout=timeout)[0]
        elapsed = time.monotonic() - start
        assert grade.score == 0.0  # exact: a float(bool) score
        assert elapsed < timeout + 1.5, f"{answer[:20]!r} took {elapsed:.1f}s"


def test_reward_function_reads_dataset_columns():
    fn = reward_function("gsm8k")
    completions = [[{"role": "assistant", "content": c}] for c in ["#### 4", "#### 5", "4", "#### 4 #### 4"]]
    rewards = fn(prompts=[None] * 4, completions=completions, gold=["4"] * 4, task=["gsm8k"] * 4)
    assert rewards == [1.0, 0.0, 0.0, 0.0]
    assert fn.__name__ == "correct_gsm8k"


def test_grade_cli(tmp_path):
    rows = [{"completion": "x #### 1/2", "gold": "\\frac{1}{2}", "id": "a"},
            {"completion": "y \\boxed{3}", "gold": "3", "id": "b"},
            {"completion": "#### 10^{10^{10}}", "gold": "3", "id": "c"}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    run = lambda *a: subprocess.run([sys.executable, "-m", "tarpo.cli", "grade", *a], capture_output=True,  # noqa
                                    text=True, timeout=120)
    res = run("--task", "math500", str(src), "--out", str(out), "--timeout", "4")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "graded 3 correct 2 timeouts 1"
    graded = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["score"] for g in graded] == [1.0, 1.0, 0.0] and graded[0]["id"] == "a"
    res = run("--task", "math500", str(src), "--out", str(out), "--reward", "--timeout", "4")
    assert res.stdout.strip().splitlines()[-1] == "graded 3 correct 1 timeouts 1"
    # Bad input: a clear error naming line and field, and no output file written.
    src.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"completion": "x"}) + "\n")
    res = run("--task", "math500", str(src), "--out", str(tmp_path / "new.jsonl"))
    assert res.returncode == 2 and "line 2: field 'gold'" in res.stderr
    assert not (tmp_path / "new.jsonl").exists()


@needs_data
def test_all_humaneval_canonical_solutions_pass_and_wrong_ones_fail():
    ds = list(load_task("humaneval", os.path.join(DATA, "humaneval"), "test"))
    right = [f"Think.\n```python\n{e['code_prompt']}{e['gold']}```" for e in ds]
    start = time.monotonic()
    grades = grade_batch(right, ds, reward=True, timeout=20)
    failed = [e["id"] for e, g in zip(ds, grades) if g.score != 1.0]
    assert failed == [], failed
    # A body-only completion (no signature) is completed with the task's prompt.
    assert score(f"```python\n{ds[0]['gold']}```", ds[0]) == 1.0
    # Wrong: every solution returns None, and a second fence breaks the reward's format rule.
    wrong = [f"```python\n{e['code_prompt']}    return None\n```" for e in ds[:20]]
    assert all(g.score == 0.0 for g in grade_batch(wrong, ds[:20], timeout=20))  # exact: float(bool) scores
    assert score("```python\nx=1\n```\n" + right[0], ds[0], reward=True) == 0.0  # exact: a float(bool) score
    assert score("```python\nx=1\n```\n" + right[0], ds[0]) == 1.0  # scoring: the last block counts
    print(f"164 HumanEval programs in {time.monotonic() - start:.1f}s")


def test_the_training_reward_gives_up_on_a_stalling_answer_sooner_and_counts_it():
    fn = reward_function("gsm8k", grader="math_verify")
    start = time.monotonic()
    rewards = fn(prompts=[None] * 2, completions=["#### 10^{10^{10^{10}}}", "#### 7"], gold=["7", "7"],
                 task=["gsm8k"] * 2)
    elapsed = time.monotonic() - start
    assert rewards == [0.0, 1.0] and fn.timeouts == 1
    assert elapsed < 2.0 + 1.5, f"{elapsed:.1f} s"


def _marked_processes(marker):
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_grade_leaves_no_workers_behind(tmp_path, request, sig):
    """Grading workers busy on slow answers die with the process; after `kill` (SIGTERM) the
    multiprocessing temp folder goes too (after SIGKILL Python 3.11's forkserver socket file stays)."""
    import uuid
    rows = [{"completion": "#### 10^{10^{10^{10}}}", "gold": "7"}] * 8
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    marker = f"TARPO_KILL_TEST={uuid.uuid4().hex}"
    # short: multiprocessing's forkserver socket lives under TMPDIR, and an AF_UNIX path holds at most 107
    # bytes (under pytest-xdist, once pytest's numbered folders pass pytest-99, tmp_path's is too long)
    tmp = Path(tempfile.mkdtemp(prefix="tk-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    env = dict(os.environ, TMPDIR=str(tmp), **dict([marker.split("=")]))
    proc = subprocess.Popen([sys.executable, "-m", "tarpo.cli", "grade", "--task", "gsm8k", "--grader", "math_verify",
                             str(src), "--out", str(tmp_path / "out.jsonl"), "--workers", "2", "--timeout", "30"],
                            env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(_marked_processes(marker)) < 4 and time.monotonic() < deadline:  # main, forkserver, 2 workers
        time.sleep(0.2)
    assert len(_marked_processes(marker)) >= 4
    time.sleep(1.0)  # the workers are inside math-verify (each answer takes ~5 s)
    proc.send_signal(sig)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 3.0  # before the fix: until each busy worker's ~5 s answer was done
    while _marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _marked_processes(marker) == []
    if sig == signal.SIGTERM:
        assert list(tmp.iterdir()) == []
