"""Several processes on CPU (gloo), through ``accelerate launch``: data-parallel training keeps one
model on every rank and equals a one-process run over the same global batch; lockstep decoding.

The 2-process runs use accelerate's multi-process launcher with ``ACCELERATE_USE_CPU=true`` (its
``--cpu`` flag starts a single process unless MPI is set up).
"""

import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 2
TOLERANCE = 1e-5  # 2 processes vs 1 process, absolute, after STEPS SGD steps (docs/several-gpus.md)


def run(script, out, *args, processes=1):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true",
           "PYTHONPATH": os.path.dirname(HERE)}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
              str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd = [*(launch if processes > 1 else [sys.executable]), os.path.join(HERE, script), str(out), *args]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]


def trainable(out, rank, step):
    return torch.load(os.path.join(out, f"rank{rank}-step{step}.pt"))


@pytest.fixture(scope="module", params=["learned", "hard"], ids=["tarpo", "grpo"])
def runs(request, tmp_path_factory):
    """The same 2 steps (global batch 8: 2 prompts x 4 completions) as 2 processes x 4 completions and as
    1 process x 2 micro-batches of 4 (gradient accumulation); SGD, so an update is linear in the gradient."""
    root = tmp_path_factory.mktemp(request.param)
    common = ("--routing", request.param, "--steps", str(STEPS), "--optim", "sgd")
    run("ddp_worker.py", root / "two", *common, processes=2)
    run("ddp_worker.py", root / "one", *common, "--grad-accum", "2")
    return root


def test_every_rank_holds_the_same_parameters_after_every_step(runs):
    for step in range(STEPS + 1):
        a, b = trainable(runs / "two", 0, step), trainable(runs / "two", 1, step)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"ranks differ at step {step}"


def test_every_rank_holds_the_reference_router_that_training_starts_from(runs):
    """Issue #25: TRL seeds each rank differently, so each drew its own router; DDP trains rank 0's, and the
    frozen reference (not a parameter DDP broadcasts) must be that router on every rank too."""
    refs = [torch.load(runs / "two" / f"ref-router-rank{rank}.pt") for rank in (0, 1)]
    assert refs[0].keys() == refs[1].keys() == {"proj.weight", "proj.bias"}
    assert all(torch.equal(refs[0][k], refs[1][k]) for k in refs[0]), "the ranks' reference routers differ"
    if runs.name.startswith("learned"):  # a trained router: the reference is where its training starts
        start = trainable(runs / "two", 0, 0)
        assert all(torch.equal(v, start[f"base_model.model.tarpo_router.{k}"]) for k, v in refs[0].items())


def test_two_processes_equal_one_process_over_the_same_global_batch(runs):
    start = trainable(runs / "one", 0, 0)
    for step in range(1, STEPS + 1):
        two, one = trainable(runs / "two", 0, step), trainable(runs / "one", 0, step)
        assert two.keys() == one.keys()
        gap = max((two[k] - one[k]).abs().max().item() for k in one)
        assert gap < TOLERANCE, f"step {step}: 2 processes differ from 1 by {gap:.2e}"
    moved = max((one[k] - start[k]).abs().max().item() for k in one)
    assert moved > 10 * TOLERANCE, "the parameters hardly moved: the comparison would prove nothing"
    assert any("tarpo_router" in k for k in one) == runs.name.startswith("learned")  # GRPO leaves it untrained


def test_without_the_wrapped_forward_the_ranks_train_two_models(tmp_path):
    """The defect: the training forward calling the decoder directly, DDP never all-reduces."""
    run("ddp_worker.py", tmp_path, "--steps", "1", "--optim", "sgd", "--direct-forward", processes=2)
    a, b = trainable(tmp_path, 0, 1), trainable(tmp_path, 1, 1)
    start = trainable(tmp_path, 0, 0)
    assert all(torch.equal(start[k], trainable(tmp_path, 1, 0)[k]) for k in start)  # one model at the start
    assert max((a[k] - b[k]).abs().max().item() for k in a) > 10 * TOLERANCE


def test_lockstep_ranks_make_the_same_decode_steps_and_the_rollouts_of_running_alone(tmp_path):
    run("lockstep_worker.py", tmp_path, processes=2)
    for engine in ("eager", "compiled"):
        r0, r1 = (torch.load(tmp_path / f"rank{r}-{engine}.pt") for r in (0, 1))
        units = [r["alone"]["rollout"]["completion_mask"].sum(-1) for r in (r0, r1)]
        assert units[0].max() <= 2 and units[1].min() == 70, "rank 0 should end at once, rank 1 run to the limit"
        assert r0["alone"]["steps"] < r1["alone"]["steps"]
        assert r0["lockstep"]["steps"] == r1["lockstep"]["steps"] == r1["alone"]["steps"], engine
        for r in (r0, r1):
            for name, value in r["alone"]["rollout"].items():
                assert torch.equal(r["lockstep"]["rollout"][name], value), (engine, name)


def test_sharded_parameters_are_refused_with_a_pointer_to_the_docs():
    from types import SimpleNamespace

    from tarpo.distributed import check_not_sharded

    check_not_sharded(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=None, deepspeed_plugin=None)))
    check_not_sharded(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=2))))
    zero3 = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=3))
    for state in (SimpleNamespace(fsdp_plugin=object()), zero3):
        with pytest.raises(ValueError, match="sharded parameters.*docs/several-gpus.md"):
            check_not_sharded(SimpleNamespace(state=state))
