"""Several processes on CPU (gloo), through ``accelerate launch``: data-parallel training keeps one
model on every rank and equals a one-process run over the same global batch; lockstep decoding;
through the launcher with its default optimizer, zero-advantage batches train nothing on any
number of processes.

The 2-process runs use accelerate's multi-process launcher with ``ACCELERATE_USE_CPU=true`` (its
``--cpu`` flag starts a single process unless MPI is set up).
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import DATA, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STEPS = 2
TOLERANCE = 1e-7  # 2 processes vs 1 process, absolute, after STEPS SGD steps (docs/several-gpus.md)


def run(script, out, *args, processes=1):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true",
           "PYTHONPATH": os.path.dirname(HERE)}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
              str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port())]
    cmd = [*(launch if processes > 1 else [sys.executable]), os.path.join(HERE, "workers", script), str(out), *args]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]


def trainable(out, rank, step):
    return torch.load(os.path.join(out, f"rank{rank}-step{step}.pt"))


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
    """TARPO (learned routing) and GRPO (hard), each the same 2 steps (global batch 8: 2 prompts x 4 completions)
    as 2 processes x 4 completions and as 1 process x 2 micro-batches of 4 (gradient accumulation); SGD, so an
    update is linear in the gradient. One launch of each kind trains both, in turn; the 2 processes then train
    TARPO once more with the training forward calling the decoder directly (the defect of
    test_without_the_wrapped_forward_the_ranks_train_two_models)."""
    root = tmp_path_factory.mktemp("ddp")
    common = ("--steps", str(STEPS), "--optim", "sgd")
    run("ddp_worker.py", root / "two", "--cases",
        "learned:vowels,hard:vowels,learned:vowels:direct,learned:vowels:nanrank0", *common, processes=2)
    run("ddp_worker.py", root / "one", "--cases", "learned:vowels,hard:vowels", *common, "--grad-accum", "2")
    return root


@pytest.fixture(params=["learned", "hard"], ids=["tarpo", "grpo"])
def runs(request, both_runs):
    """One routing's runs: ``two`` and ``one`` (the folders of each rank's tensors), ``learned``."""
    from types import SimpleNamespace
    return SimpleNamespace(two=both_runs / "two" / f"{request.param}-vowels",
                           one=both_runs / "one" / f"{request.param}-vowels", learned=request.param == "learned")


def test_every_rank_holds_the_same_parameters_after_every_step(runs):
    for step in range(STEPS + 1):
        a, b = trainable(runs.two, 0, step), trainable(runs.two, 1, step)
        # exact: every rank applies the same all-reduced gradient with the same kernels to the same parameters
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"ranks differ at step {step}"


def test_every_rank_holds_the_reference_router_that_training_starts_from(runs):
    """TRL seeds each rank differently, so each drew its own router; DDP trains rank 0's, and the
    frozen reference (not a parameter DDP broadcasts) must be that router on every rank too."""
    refs = [torch.load(runs.two / f"ref-router-rank{rank}.pt") for rank in (0, 1)]
    # GRPO has no router, hence no reference router
    assert refs[0].keys() == refs[1].keys() == ({"proj.weight", "proj.bias"} if runs.learned else set())
    # exact: rank 0's router is copied to every rank (same_on_every_rank), never recomputed
    assert all(torch.equal(refs[0][k], refs[1][k]) for k in refs[0]), "the ranks' reference routers differ"
    if runs.learned:  # a trained router: the reference is where its training starts
        start = trainable(runs.two, 0, 0)
        # exact: the frozen reference is a copy of the initial router
        assert all(torch.equal(v, start[f"base_model.model.tarpo_router.{k}"]) for k, v in refs[0].items())


def test_two_processes_equal_one_process_over_the_same_global_batch(runs):
    start = trainable(runs.one, 0, 0)
    for step in range(1, STEPS + 1):
        two, one = trainable(runs.two, 0, step), trainable(runs.one, 0, step)
        assert two.keys() == one.keys()
        gap = max((two[k] - one[k]).abs().max().item() for k in one)
        assert gap < TOLERANCE, f"step {step}: 2 processes differ from 1 by {gap:.2e}"
    moved = max((one[k] - start[k]).abs().max().item() for k in one)
    assert moved > 10 * TOLERANCE, "the parameters hardly moved: the comparison would prove nothing"
    assert any("tarpo_router" in k for k in one) == runs.learned  # GRPO leaves it untrained


def test_without_the_wrapped_forward_the_ranks_train_two_models(both_runs):
    """The defect: the training forward calling the decoder directly, DDP never all-reduces."""
    out = both_runs / "two" / "learned-vowels-direct"
    a, b = trainable(out, 0, 1), trainable(out, 1, 1)
    start = trainable(out, 0, 0)
    assert all(torch.equal(start[k], trainable(out, 1, 0)[k]) for k in start)  # exact: one model, copied
    assert max((a[k] - b[k]).abs().max().item() for k in a) > 10 * TOLERANCE


def test_a_nan_loss_on_one_rank_skips_the_step_on_every_rank(both_runs):
    """Rank 0's first loss NaN, its gradients finite (DDP's all-reduce spreads nothing): both ranks skip step 1 and
    stay one model (before: rank 0 skipped, rank 1 stepped, and the replicas parted for good)."""
    out = both_runs / "two" / "learned-vowels-nanrank0"
    start = trainable(out, 0, 0)
    for step in range(STEPS + 1):
        a, b = trainable(out, 0, step), trainable(out, 1, step)
        assert all(torch.equal(a[k], b[k]) for k in a), f"ranks differ at step {step}"  # exact: one decision
    assert all(torch.equal(trainable(out, 0, 1)[k], start[k]) for k in start)  # step 1 skipped everywhere
    # exact: any change at all counts as trained (later steps train)
    assert any(not torch.equal(trainable(out, 0, STEPS)[k], start[k]) for k in start)


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
                assert torch.equal(r["lockstep"]["rollout"][name], value), (engine, name)  # exact: same ops, shapes


def test_only_fsdp2_shards_the_trainer_refuses_fsdp1_and_zero3_naming_the_docs():
    from types import SimpleNamespace

    from tarpo.training.sharding import check_sharding

    assert not check_sharding(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=None, deepspeed_plugin=None)))
    assert not check_sharding(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=2))))
    assert check_sharding(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=SimpleNamespace(fsdp_version=2))))
    zero3 = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=3))
    for state in (SimpleNamespace(fsdp_plugin=SimpleNamespace(fsdp_version=1)), zero3):
        with pytest.raises(ValueError, match="FSDP2 only.*docs/several-gpus.md"):
            check_sharding(SimpleNamespace(state=state))


@pytest.fixture(scope="module")
def zero_reward_runs(tmp_path_factory):
    """run_gsm8k.sh on a tiny random Qwen2 (every reward 0, so every advantage 0 and the loss is the KL terms
    alone) for 3 steps, with 1 and with 2 processes, the launcher's own optimizer (OPTIM unset: on this
    CPU-only machine what tarpo.config.resolve_optimizer makes of paged_adamw_8bit) and its learning rates
    raised (docs/several-gpus.md). The eager engine: the rollout engine plays no part here.

    MKL_CBWR=COMPATIBLE: the step-1 loss is exactly 0 only if the policy (adapter with B = 0) and the reference
    (adapter disabled) forwards round alike. They are the same products on the same shapes, but Intel MKL's
    AVX-512 sgemm kernels do not promise bitwise-equal results for two calls on equal inputs held at other
    addresses (on an Intel Xeon the loss came out -1.56e-12 and, Adam normalising that noise, 1 and 2 processes
    differed by 6.9e-3 after 3 steps); MKL's conditional numerical reproducibility mode does. What is tested is
    the trainer's logic, with the BLAS held to reproducible kernels; tests/test_kernel_settings.py checks the
    tolerance that plain kernels allow."""
    if not os.path.isdir(os.path.join(DATA, "gsm8k")):
        pytest.skip("../shared/data is not beside the checkout")
    from tarpo.runs.launch_variables import SETTINGS, VARIABLES
    from tarpo.models.tiny import char_tokenizer, tiny_causal_lm

    root = tmp_path_factory.mktemp("launcher")
    tok = char_tokenizer()
    tiny_causal_lm(tok, "qwen2", seed=0).save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    clean = {k: v for k, v in os.environ.items()  # no launcher setting of the caller's: the defaults
             if k not in {*VARIABLES, *SETTINGS, "RANK", "LOCAL_RANK", "TARPO_LAUNCHED"}}
    runs = {}
    for n in (1, 2):
        env = {**clean, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT, "PYTHON": sys.executable,
               "MODEL": str(root / "tiny"), "DATA_PATH": os.path.join(DATA, "gsm8k"), "OUT_DIR": str(root / str(n)),
               "NUM_PROCESSES": str(n), "ACCELERATE_USE_CPU": "true", "TRAIN_LIMIT": "16", "MAX_STEPS": "3",
               "BATCH": "8", "GROUP_SIZE": "4", "MAX_PROMPT_LENGTH": "400", "MAX_COMPLETION_LENGTH": "12",
               "ACTION_BIAS": "0,0", "LORA_R": "4", "LORA_ALPHA": "8", "LR": "1e-2", "ROUTER_LR": "1e-1",
               "ENGINE": "eager", "MKL_CBWR": "COMPATIBLE"}
        res = subprocess.run(["bash", os.path.join(ROOT, "run_gsm8k.sh")], env=env, capture_output=True, text=True,
                             timeout=900)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
        (run,) = (root / str(n)).iterdir()
        runs[n] = run
    return runs


def adapter_and_router(run):
    from safetensors.torch import load_file

    return {**load_file(run / "adapter" / "adapter_model.safetensors"),
            **{f"router.{k}": v for k, v in load_file(run / "adapter" / "router.safetensors").items()}}


def test_zero_advantages_train_nothing_on_one_process_or_two(zero_reward_runs):
    """At step 1 the policy is the reference, so the KL terms, and with zero advantages the whole
    loss, are exactly 0 and so is their gradient; Adam would turn any numerical noise there into full-size
    steps. Both process counts must train the same (nothing but weight decay)."""
    from tarpo.config import resolve_optimizer

    for n, run in zero_reward_runs.items():
        steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
        # exact: the mean of rewards that are all 0.0
        assert [s["step"] for s in steps] == [1, 2, 3] and all(s["reward"] == 0 for s in steps), n
        launched = json.loads((run / "launch_config.json").read_text())
        assert launched["trainer"]["optim"] == "paged_adamw_8bit" and launched["num_processes"] == n  # the default
        used = torch.load(run / "adapter" / "training_args.bin", weights_only=False).optim  # what the Trainer ran
        assert used == resolve_optimizer("paged_adamw_8bit") and "adam" in used, used  # 8-bit AdamW (bitsandbytes)
        # exact: the same products on the same shapes, MKL held to reproducible kernels (the fixture says why)
        assert steps[0]["loss"] == 0.0 and steps[0]["kl_tok"] == 0.0 and steps[0]["kl_act"] == 0.0, (n, steps[0])
        assert steps[0]["grad_norm"] < 1e-9, (n, steps[0]["grad_norm"])
    one, two = (adapter_and_router(zero_reward_runs[n]) for n in (1, 2))
    assert one.keys() == two.keys() and any(k.startswith("router.") for k in one) and any("lora_B" in k for k in one)
    gaps = {k: (one[k].float() - two[k].float()).abs().max().item() for k in one}
    worst = max(gaps, key=gaps.get)
    assert gaps[worst] < 1e-4, f"after 3 steps 1 and 2 processes differ by {gaps[worst]:.2e} ({worst})"
