"""FSDP2 on CPU (gloo) through ``accelerate launch`` (tarpo.training.sharding, docs/several-gpus.md): 2 sharded
processes train what 1 process trains, a killed 2-process run resumes and ends where
the uninterrupted run ends (DDP to 1e-6, FSDP2 on the compiled engine within a stated tolerance), and the launcher
starts a run over 2 machines x 1 process (the uninterrupted run).

accelerate makes its FSDP plugin only for GPU-like process groups; tests/workers/fsdp_cpu.py lets it do so on
the CPU (tests/workers/fsdp_site puts it into every process that ``accelerate launch`` starts).
"""

import glob
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import DATA, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SITE = os.path.join(HERE, "workers", "fsdp_site")
TOLERANCE = 1e-5  # 2 FSDP2 processes vs 1 process, absolute, after 2 Adam steps (the bound)
# tolerance: a resumed FSDP2 run on the compiled engine against the DDP run on the eager engine, after 3 AdamW steps
# at rates 1e-2 and 1e-1 (reduce-scatter vs all-reduce order): measured 9.7e-6 (AMD EPYC, 2026-11-26); a resume
# that loses any state (optimizer shards, RNG, data position) moves the parameters by about a learning rate
RESUMED_TOLERANCE = 1e-4
CASES = "learned:vowels,learned:zero,hrpo:vowels,hrpo:zero"
FSDP2 = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
         "--fsdp_state_dict_type", "SHARDED_STATE_DICT", "--fsdp_cpu_ram_efficient_loading", "false"]


def env(**extra):
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true",
            "TARPO_TEST_FSDP_ON_CPU": "1", "PYTHONPATH": os.pathsep.join([SITE, ROOT]), **extra}


def worker(out, *args, processes=1):
    launch = [sys.executable, "-m", "accelerate.commands.launch", *FSDP2, "--num_processes", str(processes),
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port())]
    script = os.path.join(HERE, "workers", "ddp_worker.py")
    cmd = [*(launch if processes > 1 else [sys.executable]), script, str(out), "--steps", "2", "--optim",
           "adamw_torch", *args]
    res = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """TARPO and HRPO, with the share of vowels as reward and with every reward 0: 2 FSDP2 processes x 4
    completions, and 1 process x 2 micro-batches of 4 (the same global batch); AdamW, eager engine (the compiled
    engine under FSDP2: test_a_killed_two_process_run_resumes_and_ends_where_an_uninterrupted_one_ends)."""
    root = tmp_path_factory.mktemp("fsdp")
    worker(root / "two", "--cases", CASES, processes=2)
    worker(root / "one", "--cases", CASES, "--grad-accum", "2")
    return root


def trainable(folder, step, rank=0):
    return torch.load(os.path.join(folder, f"rank{rank}-step{step}.pt"))


def test_the_parameters_are_sharded_over_the_two_processes(runs):
    for rank in (0, 1):
        held = json.loads((runs / "two" / "learned-vowels" / f"shards-rank{rank}.json").read_text())
        assert held["units"] >= 4, held  # the root, the embedding/head, one per decoder layer (2)
        assert held["held"] <= 0.55 * held["total"], held  # about half of every tensor on each rank


@pytest.mark.parametrize("case", CASES.split(","))
def test_two_fsdp2_processes_train_what_one_process_trains(runs, case):
    folder = case.replace(":", "-")
    start = trainable(runs / "one" / folder, 0)
    for step in (1, 2):
        two, one = trainable(runs / "two" / folder, step), trainable(runs / "one" / folder, step)
        assert two.keys() == one.keys()
        gap = max((two[k] - one[k]).abs().max().item() for k in one)
        assert gap < TOLERANCE, f"{case} step {step}: 2 FSDP2 processes differ from 1 by {gap:.2e}"
    heads = [k for k in one if "tarpo_router" in k or "tarpo_soft_input" in k]
    assert heads and any("lora_B" in k for k in one)  # the router (TARPO) or the gate (HRPO) trained with LoRA
    moved = max((one[k] - start[k]).abs().max().item() for k in heads)
    if case.endswith("vowels"):
        assert moved > 100 * TOLERANCE, "the router/gate hardly moved: the comparison would prove nothing"


def launcher(out_dir, **extra):
    """run_gsm8k.sh on the tiny model at ``MODEL``, with the dense reward of tests/workers/fsdp_cpu.py and fp32
    AdamW (what a sharded run uses: runs.presets) whether sharded or not, so that DDP and FSDP2 runs compare.
    8-bit AdamW's resume: tests/test_checkpoints.py, tests/test_unsloth_trainer.py."""
    variables = dict(PYTHON=sys.executable, DATA_PATH=os.path.join(DATA, "gsm8k"), OUT_DIR=str(out_dir),
                     TARPO_TEST_REWARD="vowels", TRAIN_LIMIT="16", BATCH="8", GROUP_SIZE="4",
                     MAX_PROMPT_LENGTH="400", MAX_COMPLETION_LENGTH="12", ACTION_BIAS="0,0", LORA_R="4",
                     LORA_ALPHA="8", LR="1e-2", ROUTER_LR="1e-1", ENGINE="eager", LR_SCHEDULE="constant",
                     OPTIM="adamw_torch", SAVE_STEPS="1", MAX_STEPS="3", NUM_PROCESSES="2",
                     MAIN_PROCESS_PORT=str(free_port()))
    from tarpo.runs.launch_variables import SETTINGS, VARIABLES
    clean = {k: v for k, v in env().items()
             if k not in {*VARIABLES, *SETTINGS, "RANK", "LOCAL_RANK", "TARPO_LAUNCHED"}}
    return subprocess.Popen(["bash", os.path.join(ROOT, "run_gsm8k.sh")], env={**clean, **variables, **extra},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finished(proc):
    out, _ = proc.communicate(timeout=900)
    return proc.returncode, out


def adapter(out_dir):
    from safetensors.torch import load_file
    (folder,) = glob.glob(os.path.join(out_dir, "*", "adapter"))
    return {**load_file(os.path.join(folder, "adapter_model.safetensors")),
            **{f"router.{k}": v for k, v in load_file(os.path.join(folder, "router.safetensors")).items()}}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    if not os.path.isdir(os.path.join(DATA, "gsm8k")):
        pytest.skip("../shared/data is not beside the checkout")
    from tarpo.models.tiny import char_tokenizer, tiny_causal_lm
    folder = tmp_path_factory.mktemp("tiny")
    tok = char_tokenizer()
    tiny_causal_lm(tok, "qwen2", seed=0).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model):
    """The launcher's 3-step DDP run (a checkpoint each step) started as a cluster starts it: NUM_MACHINES=2 x 1
    process on this host (gloo, localhost), one launcher per machine. Returns the run folder and each machine's
    output."""
    out = tmp_path_factory.mktemp("uninterrupted")
    common = dict(MODEL=tiny_model, NUM_MACHINES="2", MAIN_PROCESS_IP="127.0.0.1",
                  MAIN_PROCESS_PORT=str(free_port()))
    results = [finished(m) for m in [launcher(out, MACHINE_RANK=str(rank), **common) for rank in (0, 1)]]
    for rank, (status, log) in enumerate(results):
        assert status == 0, f"machine {rank}: {log[-3000:]}"
    (run,) = glob.glob(str(out / "*"))
    return run, [log for _, log in results]


def test_the_launcher_starts_a_run_over_two_machines_of_one_process(uninterrupted):
    run, logs = uninterrupted
    assert "--num_machines 2 --machine_rank 0 --main_process_ip 127.0.0.1" in logs[0]
    assert "--num_machines 2 --machine_rank 1 --main_process_ip 127.0.0.1" in logs[1]
    steps = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl")) if '"loss"' in x]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert json.loads(open(os.path.join(run, "launch_config.json")).read())["num_machines"] == 2


@pytest.mark.parametrize("sharded", [False, True], ids=["ddp-preempted", "fsdp2-compiled"])
def test_a_killed_two_process_run_resumes_and_ends_where_an_uninterrupted_one_ends(tmp_path, tiny_model,
                                                                                   uninterrupted, sharded):
    """The launcher with 2 processes on one machine (3 steps), stopped and run again, against the uninterrupted run
    over 2 machines. DDP: rank 1 alone is sent SIGTERM as step 2 begins (SAVE_STEPS=100, a preemption that
    reaches one process), rank 0 hears of it through the processes' agreement, both finish step 2, save
    checkpoint-2 together and stop; the launcher says so in one line and exits 75 (tarpo.training.preemption);
    the re-run ends there to 1e-6 (the same all-reduced steps; on the CPU the Trainer once loaded the optimizer
    with map_location="cpu:0" and failed: tarpo.training.resume.load_optimizer_on_cpu). FSDP2, on the
    compiled engine (the rollout over the gathered parameters): SIGKILLed once checkpoint-2 is published (a
    checkpoint each step), it ends within RESUMED_TOLERANCE."""
    extra = {"MODEL": tiny_model,
             **({"ACCELERATE_CONFIG": os.path.join(ROOT, "configs", "fsdp2.yaml"), "ENGINE": "compiled"}
                if sharded else {"SAVE_STEPS": "100"})}
    stop = {"TARPO_TEST_KILL_AFTER": "2"} if sharded else {"TARPO_TEST_SIGNAL_AT": "2"}
    status, out = finished(launcher(tmp_path / "killed", **stop, **extra))
    assert status != 0 and not glob.glob(str(tmp_path / "killed" / "*" / "adapter")), out[-3000:]
    if not sharded:
        (run,) = glob.glob(str(tmp_path / "killed" / "*"))
        line = f"stopped by a signal to another process after step 2: {run}/checkpoint-2 is complete"
        assert status == 75 and line in out, out[-3000:]
        assert os.path.isfile(os.path.join(run, "checkpoint-2", "checkpoint_manifest.json"))
        assert not glob.glob(os.path.join(run, "checkpoint-1")) and not glob.glob(os.path.join(run, "checkpoint-3"))
    status, out = finished(launcher(tmp_path / "killed", **extra))
    assert status == 0 and "resuming from" in out and "checkpoint-2" in out, out[-3000:]
    a, b = adapter(os.path.dirname(uninterrupted[0])), adapter(tmp_path / "killed")
    assert a.keys() == b.keys() and any("lora_B" in k for k in a)
    gap = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"{'FSDP2' if sharded else 'DDP'}: {gap:.2e}")
    assert gap <= (RESUMED_TOLERANCE if sharded else 1e-6), gap
    steps = [json.loads(x) for x in open(glob.glob(str(tmp_path / "killed" / "*" / "metrics.jsonl"))[0])
             if '"loss"' in x]
    assert [s["step"] for s in steps] == [1, 2, 3]  # the resumed run logged step 3 once, after steps 1 and 2
    if sharded:  # the checkpoint holds the sharded optimizer state and a PEFT adapter one process loads
        (checkpoint,) = glob.glob(str(tmp_path / "killed" / "*" / "checkpoint-2"))
        assert os.path.isdir(os.path.join(checkpoint, "optimizer_0"))
        from peft import PeftModel
        from transformers import AutoModelForCausalLM
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), checkpoint)
        assert any("lora_B" in n for n, _ in model.named_parameters())
