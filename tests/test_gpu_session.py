"""``benchmarks/gpu_session.sh``'s two calls, smoke-tested on the CPU (``ALLOW_CPU=1``): a GPU session has 15 minutes
and no second chance, so the plumbing its two calls depend on (the learning check through the launcher, the MATH
launcher run, the copies of every figure under the results folder as it exists, the JSON line each call ends with)
runs here end to end at tiny sizes, through the same script and the same code (docs/gpu/README.md)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import DATA, ROOT, needs

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_session  # noqa: E402

pytestmark = needs("math")


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory):
    """The carried data folder as ``gpu_session.py data`` makes it, with a warm start of one supervised step (the
    plumbing needs its folder, not its skill)."""
    from tarpo.runs import demo

    root = tmp_path_factory.mktemp("gpu-data")
    gpu_session.write_rows(str(root), DATA)
    shutil.copytree(demo.warm_start(str(root / "cache"), sft_steps=1, seed=0, noise=0.4), root / "warm")
    return str(root)


def session(call, gpu_data, out):
    env = {**os.environ, "ALLOW_CPU": "1", "RESULTS_DIR": str(out), "GPU_DATA": gpu_data, "PYTHON": sys.executable,
           "SESSION_WORK": str(out / "work")}
    env.pop("OUT", None)
    res = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_session.sh"), call], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_call1_runs_the_learning_check_and_ends_with_its_figures(gpu_data, tmp_path):
    out = session("call1", gpu_data, tmp_path)
    assert out["call"] == "call1" and set(out["learning"]) == {"grpo", "tarpo"}
    for algo, figures in out["learning"].items():
        assert figures["steps"] == 3 and len(figures["curve"]) == 3, (algo, figures)
        assert all(figures[k] is not None for k in ("first", "last", "rise", "rise_se", "step_s", "logp_drift",
                                                    "logp_drift_p99", "logp_drift_max")), figures  # the tails too
        assert figures["peak_gib"] is None  # CUDA only
        copy = [json.loads(line) for line in open(tmp_path / f"learning-{algo}.jsonl")]
        assert [r["reward"] for r in copy if "reward" in r] == pytest.approx(figures["curve"], abs=1e-4)
    assert out["learning"]["tarpo"]["soft_ratio"] > 0 and out["learning"]["grpo"]["soft_ratio"] == 0  # exact: none
    assert len(os.listdir(tmp_path)) - 1 <= 8  # at most 8 files come back from the device (the work folder aside)


def test_call2_runs_two_math_steps_and_ends_with_their_figures(gpu_data, tmp_path):
    out = session("call2", gpu_data, tmp_path)
    math = out["math"]
    assert math["micro_batch"] == 16 and math["plan_gib"] > 0
    assert [s["step"] for s in math["steps"]] == [1, 2]
    for step in math["steps"]:
        assert step["rollout_s"] > 0 and step["step_s"] > step["rollout_s"]
        assert {"peak_gib", "reserved_gib", "rollout_peak_gib"} <= set(step)  # null without CUDA
    assert os.path.isfile(tmp_path / "math.jsonl") and os.path.isfile(tmp_path / "math_plan.json")
