"""``tarpo eval`` with several processes (``accelerate launch --multi_gpu``, gloo on CPU): the chunks
are split between the ranks, and the trajectory file and metrics are those of one process."""

import json
import os
import re
import subprocess
import sys

from helpers import DATA, ROOT, free_port, needs_data
from tarpo.cli import main as cli


def eval_args(tiny, out, *extra, limit=6):
    """Chunks of 2 questions x 2 samples; the eager engine (the compiled one compiles each chunk's
    shape in every process, minutes on a cold cache; it is dealt to ranks the same way)."""
    model, adapter = tiny
    return ["eval", "--model", model, "--adapter", adapter, "--tasks", "gsm8k", "--data-dir", DATA,
            "--limit", str(limit), "--n", "2", "--batch-size", "4", "--max-new-tokens", "8", "--engine", "eager",
            "--out", str(out), *extra]


def launch(args, processes=2):
    """``tarpo <args>`` in ``processes`` processes through ``accelerate launch`` on the CPU."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port()), "-m", "tarpo.cli", *args]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def metrics(out):
    with open(os.path.join(out, "gsm8k.results.json")) as f:
        return json.load(f)


@needs_data
def test_two_processes_write_the_file_and_metrics_of_one(tiny, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli(eval_args(tiny, one)) == 0
    res = launch(eval_args(tiny, two))  # 3 chunks: rank 0 samples chunks 0 and 2, rank 1 chunk 1
    assert res.returncode == 0, res.stderr[-3000:]
    # exact: each chunk is decoded with its own seed and batch in one rank (no reduction)
    assert (one / "gsm8k.jsonl").read_bytes() == (two / "gsm8k.jsonl").read_bytes()
    assert len((two / "gsm8k.jsonl").read_bytes().splitlines()) == 12
    a, b = metrics(one), metrics(two)
    assert a["metrics"] == b["metrics"] and a["settings"] == b["settings"]  # exact: metrics of byte-equal records
    assert (a["processes"], b["processes"]) == (1, 2)
    assert res.stdout.count("gsm8k: pass@1 ") == 1 and res.stdout.count("results in ") == 1  # rank 0 alone
    assert sorted(os.listdir(two)) == ["gsm8k.jsonl", "gsm8k.results.json", "gsm8k.settings.json"]


@needs_data
def test_two_processes_resume_a_cut_file_into_the_uninterrupted_one(tiny, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert cli(eval_args(tiny, whole, limit=10)) == 0  # 5 chunks of 4 lines
    full = (whole / "gsm8k.jsonl").read_bytes()
    resumed.mkdir()
    (resumed / "gsm8k.settings.json").write_bytes((whole / "gsm8k.settings.json").read_bytes())
    cut = full.splitlines(keepends=True)
    # chunk 0, one line of chunk 1 and half a line: a run killed while appending chunk 1
    (resumed / "gsm8k.jsonl").write_bytes(b"".join(cut[:5]) + cut[5][:40])
    res = launch(eval_args(tiny, resumed, limit=10))  # chunks 1-4 left: two rounds of two
    assert res.returncode == 0, res.stderr[-3000:]
    # exact: each chunk is decoded with its own seed and batch in one rank (no reduction)
    assert (resumed / "gsm8k.jsonl").read_bytes() == full
    assert metrics(whole)["metrics"] == metrics(resumed)["metrics"]  # exact: metrics of byte-equal records


@needs_data
def test_a_bad_setting_fails_every_process_before_any_model_loads(tiny, tmp_path):
    assert cli(eval_args(tiny, tmp_path, limit=2)) == 0
    before = (tmp_path / "gsm8k.jsonl").read_bytes()
    args = eval_args(tiny, tmp_path, "--seed", "1", limit=2)
    args[args.index("--model") + 1] = "/no/such/model"  # loading it would fail with another message
    res = launch(args)
    assert res.returncode != 0
    errors = [line for line in res.stderr.splitlines() if line.startswith("tarpo eval: error: ")]
    # every rank fails with rank 0's message (the launcher may stop rank 0 before it prints its own)
    assert errors and all("gsm8k.jsonl was written with other settings" in e and "seed: 0 -> 1" in e for e in errors)
    assert not re.search(r'File ".*tarpo[/\\]\w+\.py"', res.stderr)  # no rank crashed (the launcher has a traceback)
    assert (tmp_path / "gsm8k.jsonl").read_bytes() == before
