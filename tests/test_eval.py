"""``tarpo eval`` on a tiny random model and real benchmark files: outputs, resume, bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import eval_args, needs_data
from tarpo.cli import main as cli
from tarpo.evaluation.metrics import pass_at_k

def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@needs_data
def test_eval_writes_trajectories_and_results_on_real_gsm8k(tiny, tmp_path, capsys):
    assert cli(eval_args(tiny, tmp_path, "--k", "1,2,4", "--system", "TARPO")) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-2].startswith("gsm8k: pass@1 ")
    traj = lines(tmp_path / "gsm8k.jsonl")
    assert len(traj) == 80
    per_q = {}
    for r in traj:
        per_q.setdefault(r["id"], []).append(r["sample"])
        assert len(r["tokens"]) == r["units"] == len(r["actions"]) == len(r["p_soft"])
        assert r["soft_steps"] == r["actions"].count("s") and r["hard_tokens"] == r["units"] - r["soft_steps"]
        assert r["score"] in (0.0, 1.0) and "answer" in r and "marked" in r
    assert len(per_q) == 20 and all(sorted(v) == [0, 1, 2, 3] for v in per_q.values())
    res = json.load(open(tmp_path / "gsm8k.results.json"))
    m = res["metrics"]
    counts = {}
    for r in traj:
        counts[r["id"]] = counts.get(r["id"], 0) + int(r["score"])
    assert m["pass@2"] == pytest.approx(sum(pass_at_k(4, c, 2) for c in counts.values()) / 20)
    assert m["pass@1"] == pytest.approx(sum(r["score"] for r in traj) / 80)
    assert 0.2 < m["soft_ratio"] < 0.8  # the 50/50 router really routes soft
    assert {"maj@4", "accuracy_sd", "accuracy_ci95", "units", "hard_tokens"} <= set(m)
    # exact: strings and integers
    assert res["system"] == "TARPO" and res["task"] == "gsm8k" and res["n"] == 4 and res["seed"] == 0
    assert res["grader"]["grader"] == "gsm8k" and res["packages"]["torch"] and res["date"]
    assert res["settings"]["temperature"] == 0.5 and res["settings"]["max_prompt_length"] == 512


def _run_eval_subprocess(tiny, out):
    cmd = [sys.executable, "-m", "tarpo.cli", *eval_args(tiny, out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})


@needs_data
def test_eval_killed_and_rerun_equals_an_uninterrupted_run(tiny, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert cli(eval_args(tiny, whole)) == 0

    proc = _run_eval_subprocess(tiny, resumed)
    path = resumed / "gsm8k.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if path.exists() and path.stat().st_size > 0:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(lines(path)) if path.exists() else 0
    assert killed_at < 80, "the run finished before it could be killed"
    assert not (resumed / "gsm8k.results.json").exists()

    assert cli(eval_args(tiny, resumed)) == 0
    a, b = lines(whole / "gsm8k.jsonl"), lines(path)
    assert len(b) == 80 and len({(r["id"], r["sample"]) for r in b}) == 80
    assert a == b  # exact: the rerun decodes each chunk left with its own seed and batch, as the whole run did
    ma = json.load(open(whole / "gsm8k.results.json"))["metrics"]
    mb = json.load(open(resumed / "gsm8k.results.json"))["metrics"]
    assert ma == mb  # exact: metrics of equal records


@pytest.mark.parametrize("change, message", [
    (["--tasks", "gsm9k"], "--tasks: unknown task gsm9k"),
    (["--adapter", "/no/such/adapter"], "--adapter /no/such/adapter: no adapter_config.json"),
    (["--k", "8"], "--k 8: pass@k and maj@k need 1 <= k <= n (n=4)"),
    (["--mode", "greedy"], "--n 4: mode greedy takes one argmax sample"),
])
def test_bad_input_fails_before_any_model_is_loaded(tiny, tmp_path, capsys, change, message):
    args = eval_args(tiny, tmp_path)
    args[args.index("--model") + 1] = "/no/such/model"  # loading it would fail with another message
    assert cli(args + change) == 2  # the later flag wins
    assert message in capsys.readouterr().err
    assert not (tmp_path / "gsm8k.jsonl").exists()


@needs_data
def test_a_changed_setting_refuses_to_mix_with_an_old_file(tiny, tmp_path, capsys):
    assert cli(eval_args(tiny, tmp_path, "--limit", "2")) == 0
    before = (tmp_path / "gsm8k.jsonl").read_bytes()
    args = eval_args(tiny, tmp_path, "--limit", "2")
    args[args.index("--model") + 1] = "/no/such/model"
    args[args.index("--n") + 1] = "2"
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert "gsm8k.jsonl was written with other settings" in err and "n: 4 -> 2" in err and "--restart" in err
    assert (tmp_path / "gsm8k.jsonl").read_bytes() == before
    assert cli([*eval_args(tiny, tmp_path, "--limit", "2"), "--n", "2", "--restart"]) == 0
    assert len(lines(tmp_path / "gsm8k.jsonl")) == 4


@needs_data
def test_the_engine_is_a_setting_of_the_samples(tiny, tmp_path, capsys):
    """The engines draw different random streams: a file of one does not resume with the other."""
    assert cli(eval_args(tiny, tmp_path, "--limit", "2", "--engine", "compiled")) == 0
    settings = json.load(open(tmp_path / "gsm8k.settings.json"))
    assert settings["engine"] == "compiled"
    assert cli(eval_args(tiny, tmp_path, "--limit", "2", "--engine", "eager")) == 2
    assert "engine: 'compiled' -> 'eager'" in capsys.readouterr().err
    assert cli(eval_args(tiny, tmp_path / "eager", "--limit", "2")) == 0  # auto on the CPU: eager
    assert json.load(open(tmp_path / "eager" / "gsm8k.settings.json"))["engine"] == "eager"
    a, b = lines(tmp_path / "gsm8k.jsonl"), lines(tmp_path / "eager" / "gsm8k.jsonl")
    assert len(a) == len(b) == 8 and [r["tokens"] for r in a] != [r["tokens"] for r in b]


@needs_data
def test_tarpo_greedy_is_one_deterministic_sample_routed_by_the_routers_argmax(tiny, tmp_path):
    from tarpo.evaluation.sample import spec_for_mode
    from tarpo.engine.rollout import RolloutSpec
    spec = spec_for_mode("tarpo_greedy", RolloutSpec(max_new_tokens=4))
    assert (spec.routing, spec.greedy, spec.router_greedy) == ("learned", True, True)
    runs = []
    for name in ("a", "b"):
        args = eval_args(tiny, tmp_path / name, "--mode", "tarpo_greedy", "--limit", "5")
        args[args.index("--n") + 1] = "1"
        assert cli(args) == 0
        runs.append(lines(tmp_path / name / "gsm8k.jsonl"))
    assert len(runs[0]) == 5 and [r["tokens"] for r in runs[0]] == [r["tokens"] for r in runs[1]]
    assert any("s" in r["actions"] for r in runs[0])  # the 50/50 router's argmax still routes soft somewhere
    settings = json.load(open(tmp_path / "a" / "gsm8k.settings.json"))
    assert settings["router"] == "argmax" and settings["mode"] == "tarpo_greedy"


@needs_data
def test_an_evaluation_compiles_one_decode_graph_per_task(tiny, tmp_path, monkeypatch):
    """Each task decodes in one shape (its longest prompt, full chunks): at most one graph per task,
    though chunks differ in prompt length and the last chunk is smaller; its decode weights are built once."""
    import torch
    from torch._dynamo.utils import counters

    from helpers import recorded_builds

    torch._dynamo.reset()
    counters.clear()
    built = recorded_builds(monkeypatch)
    args = eval_args(tiny, tmp_path, "--engine", "compiled")
    args[args.index("--tasks") + 1] = "gsm8k,math500,amc23"
    args[args.index("--limit") + 1] = "5"  # chunks of 2, 2 and 1 questions
    args[args.index("--n") + 1] = "2"
    args[args.index("--batch-size") + 1] = "4"
    assert cli(args) == 0
    assert len(lines(tmp_path / "amc23.jsonl")) == 10
    assert 1 <= counters["stats"]["unique_graphs"] <= 3
    assert built == ["all"]  # the decode weights built once for the 9 chunks: the model does not change
