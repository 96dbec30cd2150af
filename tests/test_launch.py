"""The launchers (run_*.sh): resolved configurations, CPU refusal, one end-to-end run; plot and case."""

import inspect
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from helpers import DATA, needs_data
from tarpo.cli import main as cli
from tarpo.models.tiny import char_tokenizer, tiny_causal_lm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(script, timeout=120, **env):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MODEL", "ALGO", "SEED", "EVAL", "BETA", "DRY_RUN", "NUM_PROCESSES", "ACCELERATE_CONFIG",
                          "ACCELERATE_USE_CPU", "MICRO_BATCH", "CPU_MAX_HOURS")}
    return subprocess.run(["bash", os.path.join(ROOT, script)], capture_output=True, text=True, timeout=timeout,
                          env={**clean, "HF_HUB_OFFLINE": "1", **env})


def launch_in_process(script, **env):
    """What ``bash <script>`` runs (``python -m tarpo.runs.launch <data set>``), in this process: no
    Python start-up and imports of its own (the bash layer: the tests that call :func:`launch`). The
    environment is this one less the launcher's variables, plus ``env``. Returns (exit code, stdout, stderr)."""
    from contextlib import redirect_stderr, redirect_stdout
    from io import StringIO
    from unittest import mock

    from tarpo.runs import launch as launcher
    from tarpo.runs.launch_variables import SETTINGS, VARIABLES

    clean = {k: v for k, v in os.environ.items()
             if k not in {*VARIABLES, *SETTINGS, "RANK", "LOCAL_RANK", "TARPO_LAUNCHED", "ACCELERATE_USE_CPU"}}
    out, err = StringIO(), StringIO()
    with mock.patch.dict(os.environ, {**clean, "HF_HUB_OFFLINE": "1", **env}, clear=True), \
            redirect_stdout(out), redirect_stderr(err):
        code = launcher.main([script.removeprefix("run_").removesuffix(".sh")])
    return code, out.getvalue(), err.getvalue()


def dry_run(script, **env):
    code, out, err = launch_in_process(script, DRY_RUN="1", **env)
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])


# docs/algorithm.md §5 for MATH, as a reader of the paper would write it down.
PAPER_MATH = dict(num_train_epochs=1.0, optim="paged_adamw_8bit", adam_beta2=0.99, weight_decay=0.1,
                  learning_rate=5e-6, router_lr=1e-4, beta=0.005, alpha_action_kl=1.0, action_temperature=1.0,
                  temperature=0.5, num_generations=8, soft_top_k=30, max_grad_norm=0.1,
                  per_device_train_batch_size=64, lr_scheduler_type="cosine", warmup_steps=0.1, bf16=True,
                  lora_r=32, lora_alpha=64, lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                  max_prompt_length=1024, max_completion_length=1024, routing="learned")


def test_dry_run_math_is_the_paper_configuration_for_qwen_3b_and_7b():
    cfg = dry_run("run_math.sh")
    assert cfg["model"] == "Qwen/Qwen2.5-3B-Instruct" and cfg["task"] == "math" and cfg["algo"] == "tarpo"
    assert {k: cfg["trainer"][k] for k in PAPER_MATH} == PAPER_MATH
    assert cfg["trainer"]["action_bias"] == [2.2, 0.0]
    assert cfg["eval_tasks"] == ["math", "amc23", "olympiadbench"] and cfg["eval_n"] == 32
    name = os.path.basename(cfg["run_dir"])
    assert name == "math-qwen2.5-3b-tarpo-g8-bs64-lr5e-06-beta0.005-b02.2-s0"
    seven = dry_run("run_math.sh", MODEL="qwen2.5-7b")
    assert seven["model"] == "Qwen/Qwen2.5-7B-Instruct" and seven["trainer"]["action_bias"] == [4.6, 0.0]
    t = seven["trainer"]
    assert {k: t[k] for k in PAPER_MATH if k != "per_device_train_batch_size"} == {
        k: v for k, v in PAPER_MATH.items() if k != "per_device_train_batch_size"}
    # the step's 64 completions, trained in micro-batches that fit an 80 GB GPU (tarpo.engine.memory_plan)
    assert t["per_device_train_batch_size"] * t["gradient_accumulation_steps"] == 64
    assert seven["memory_plan"]["micro_batch"] == t["per_device_train_batch_size"] < 64


def test_dry_run_other_data_sets_models_and_overrides():
    gsm = dry_run("run_gsm8k.sh")
    assert gsm["trainer"]["num_generations"] == 4 and gsm["trainer"]["per_device_train_batch_size"] == 32
    assert gsm["eval_tasks"] == ["gsm8k"]
    dapo = dry_run("run_dapo.sh", MODEL="llama3.1-8b", ALGO="hrpo", BETA="0.01")
    t = dapo["trainer"]
    assert (t["max_prompt_length"], t["max_completion_length"]) == (1024, 2048)
    assert (t["learning_rate"], t["router_lr"], t["action_bias"]) == (2e-6, 2e-6, [4.6, 0.0])
    assert t["routing"] == "hrpo" and t["beta"] == 0.01 and dapo["system"] == "HRPO"
    assert dapo["eval_tasks"] == ["gpqa_diamond", "arc_challenge", "humaneval"]
    # HRPO as its code runs it: full-vocabulary mixture, gate LR 1e-4, Lambda LR 1e-3 (docs/design-notes.md)
    assert (t["hrpo_mixture"], t["hrpo_lr"], t["hrpo_lambda_lr"]) == ("full", 1e-4, 1e-3)


def test_baseline_settings_as_their_authors_run_them():
    """ALGO presets and the launcher variables, resolved in process (tarpo.runs.presets, tarpo.runs.launch)."""
    from tarpo.runs.presets import resolve
    from tarpo.runs.run_config import trainer_arguments

    ours = resolve("math", {"ALGO": "hrpo", "HRPO_MIXTURE": "top_k", "HRPO_LAMBDA_LR": "1e-4"}).trainer
    assert (ours["hrpo_mixture"], ours["hrpo_lambda_lr"]) == ("top_k", 1e-4)
    entropy = resolve("gsm8k", {"ALGO": "grpo_entropy"}).trainer
    assert (entropy["entropy_threshold"], entropy["entropy_temperature"]) == (0.5, 1.0)
    assert resolve("gsm8k", {"ALGO": "grpo_entropy", "ENTROPY_TEMPERATURE": "0.5"}).trainer[
        "entropy_temperature"] == 0.5
    # LoRA targets: the paper's table (default, "paper") or the authors' released scripts ("all-linear")
    released = resolve("math", {"LORA_TARGETS": "all-linear"}).trainer["lora_target_modules"]
    assert released == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert resolve("math", {"LORA_TARGETS": "paper"}).trainer["lora_target_modules"] == PAPER_MATH[
        "lora_target_modules"]
    assert resolve("math", {"TOP_K": "50"}).trainer["top_k"] == 50  # the authors' generate() default
    for env, message in [({"HRPO_MIXTURE": "all"}, "HRPO_MIXTURE='all': must be one of"),
                         ({"ENTROPY_TEMPERATURE": "0"}, "ENTROPY_TEMPERATURE=0.0: must be > 0"),
                         ({"ENGINE": "fast"}, "ENGINE='fast': must be one of auto, eager, compiled")]:
        with pytest.raises(ValueError, match=message):
            trainer_arguments(resolve("math", {"ALGO": "hrpo", **env}), cuda=False)


def test_a_dry_run_on_a_gpu_with_unsloth_resolves_the_compiled_engine(monkeypatch, capsys):
    """``DRY_RUN=1 bash run_math.sh`` where CUDA and Unsloth are there (both faked): the Unsloth backend, and
    the compiled engine, which decodes the model's own tensors whichever backend loaded it."""
    import importlib.util

    from test_memory_plan import fake_gpu, run_launcher

    fake_gpu(monkeypatch, 79.1)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "unsloth" else find_spec(name, *a))
    status, out, err = run_launcher(monkeypatch, capsys, "math", DRY_RUN="1")
    assert status == 0, err
    cfg = json.loads(out.strip().splitlines()[-1])
    assert cfg["memory_plan"]["backend"] == "unsloth" and cfg["memory_plan"]["engine"] == "compiled"
    from tarpo.engine.engine_choice import engine_for
    assert [engine_for("auto", cuda) for cuda in (True, False)] == ["compiled", "eager"]
    assert engine_for("eager", cuda=True) == "eager"
    with pytest.raises(ValueError, match="ENGINE='fast': must be one of"):
        engine_for("fast", True, "ENGINE")


@pytest.mark.parametrize("env, message", [
    ({"BETA": "abc"}, "BETA='abc'"), ({"ALGO": "ppo"}, "ALGO='ppo': must be one of"),
        ({"MODEL": "qwen9"}, "MODEL='qwen9': not a preset"), ({"DATA_PATH": "/no/such"}, "DATA_PATH=/no/such"),
    ({"NUM_PROCESSES": "0"}, "NUM_PROCESSES=0: must be >= 1"), ({"NUM_PROCESSES": "x"}, "NUM_PROCESSES='x'"),
    ({"ACCELERATE_CONFIG": "/no/such"}, "ACCELERATE_CONFIG=/no/such: no such file"),
    ({"NUM_PROCESSES": "3"}, "BATCH=64: the completions of a step are shared by NUM_PROCESSES=3"),
])
def test_bad_settings_name_the_variable(env, message):
    code, _, err = launch_in_process("run_math.sh", DRY_RUN="1", **env)
    assert code == 2 and message in err


MISSPELT = [  # (the environment, the refusal): names a new user tries, and what the launcher calls them
    ({"IMPORTANCE_SAMPLING_LEVEL": "sequence"}, "IMPORTANCE_SAMPLING_LEVEL=sequence: not a launcher variable, so it "
                                                "would be ignored; did you mean IS_LEVEL?"),  # TarpoConfig's name
    ({"GUMBEL_TAU": "0", "ALGO": "tarpo_gumbel"}, "GUMBEL_TAU=0: not a launcher variable, so it would be ignored; "
                                                  "did you mean GUMBEL_TEMPERATURE?"),  # a GUMBEL_ name
    ({"LORA_RANK": "8"}, "LORA_RANK=8: not a launcher variable, so it would be ignored; did you mean LORA_R, "),
    ({"NUM_GENERATIONS": "4"}, "did you mean GROUP_SIZE?"), ({"LAMDA": "0.1"}, "did you mean LAMBDA?"),
    ({"beta": "0.01"}, "beta=0.01: not a launcher variable, so it would be ignored; did you mean BETA?"),
    ({"OUTPUT_DIR": "/tmp/runs"}, "did you mean OUT_DIR?"),  # TRL's output_dir
]


@pytest.mark.parametrize("env, message", [({"BETA": "abc"}, "BETA='abc'"),
                                          ({"DATA_PATH": "/no/such"}, "DATA_PATH=/no/such"),
                                          ({"EVAL_DATA_DIR": "/no/such"}, "EVAL_DATA_DIR=/no/such: no such folder"),
                                          *MISSPELT])
def test_a_mistyped_variable_is_refused_before_torch_or_trl_is_imported(env, message):
    """The refusal costs a Python start-up, not the seconds of importing torch, TRL, PEFT and bitsandbytes."""
    code = ("import sys; from tarpo.runs.launch import main; rc = main(['math']); "
            "print(rc, 'torch' in sys.modules, 'trl' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "DRY_RUN": "1", **env})
    assert res.stdout.split() == ["2", "False", "False"] and message in res.stderr, res.stdout + res.stderr


def test_the_two_misspellings_a_new_user_tried_are_refused_by_run_math_sh():
    """``IMPORTANCE_SAMPLING_LEVEL=sequence bash run_math.sh`` and ``GUMBEL_TAU=0 ALGO=tarpo_gumbel bash run_math.sh``
    ran with the defaults; now both stop, naming the variable meant, and together one message names both."""
    res = launch("run_math.sh", DRY_RUN="1", IMPORTANCE_SAMPLING_LEVEL="sequence", GUMBEL_TAU="0", ALGO="tarpo_gumbel")
    assert res.returncode == 2 and res.stdout == "", res.stdout[-2000:]
    assert MISSPELT[0][1] in res.stderr and MISSPELT[1][1] in res.stderr
    assert re.search(r"env (-u (IMPORTANCE_SAMPLING_LEVEL|GUMBEL_TAU) ){2}bash run_math\.sh", res.stderr), res.stderr


def environment_names_of_the_libraries():
    """Every environment variable that torch, transformers, TRL, accelerate, PEFT, datasets, huggingface_hub and
    bitsandbytes read (the names their code passes to os.environ / os.getenv): what a user's environment holds."""
    import importlib.util
    read = re.compile(r"""(?:environ\.get|getenv|environ\[|environ\.setdefault|environ\.pop)"""
                      r"""\(?\s*["']([A-Z][A-Z0-9_]*)["']""")
    names = set()
    for package in ("torch", "transformers", "trl", "accelerate", "peft", "datasets", "huggingface_hub",
                    "bitsandbytes"):
        for folder, _, files in os.walk(os.path.dirname(importlib.util.find_spec(package).origin)):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(folder, name), errors="ignore") as f:
                        names.update(read.findall(f.read()))
    return names


REALISTIC = dict(PATH=os.environ.get("PATH", "/usr/bin"), HOME=os.environ.get("HOME", "/root"),
                 CUDA_VISIBLE_DEVICES="0", WANDB_PROJECT="tarpo", WANDB_ENTITY="lab", WANDB_RUN_NAME="math-7b",
                 WANDB_MODE="offline",
                 OMP_NUM_THREADS="8", MKL_NUM_THREADS="8", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", RANK="0",
                 LOCAL_RANK="0", WORLD_SIZE="1", NODE_RANK="0", GROUP_RANK="0", PYTHON=sys.executable,
                 TOKENIZERS_PARALLELISM="false", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True", NCCL_DEBUG="WARN",
                 TORCH_HOME="/tmp/torch", TRITON_CACHE_DIR="/tmp/triton", ACCELERATE_LOG_LEVEL="info",
                 ACCELERATE_MIXED_PRECISION="bf16", TARPO_TEST_REWARD="1", SLURM_JOB_ID="1", SLURM_PROCID="0",
                 JOB_NAME="nightly", BUILD_NUMBER="7", CI="true", GITHUB_ACTION="run", GITHUB_RUN_ID="1",
                 LOG_LEVEL="INFO", MAX_JOBS="4", DATA_DIR="/data", MODEL_DIR="/models", MPLBACKEND="Agg",
                 TF_CPP_MIN_LOG_LEVEL="3", PYTHONHASHSEED="0", CUBLAS_WORKSPACE_CONFIG=":4096:8", LANG="C.UTF-8",
                 TMPDIR="/tmp", VIRTUAL_ENV="/venv", http_proxy="", no_proxy="localhost")


def test_a_realistic_environment_is_not_taken_for_misspelt_variables():
    """The rule (tarpo.runs.launch_variables.misspelt) leaves alone what other programs read: the variables of a GPU
    job, of a cluster and of CI, and every name torch and the Hugging Face libraries read."""
    from tarpo.runs.launch_variables import FAMILIES, SETTINGS, VARIABLES, misspelt

    names = environment_names_of_the_libraries() - set(VARIABLES) - set(SETTINGS)  # RANK, LOCAL_RANK: read alike
    assert {"CUDA_VISIBLE_DEVICES", "HF_HOME", "ACCELERATE_USE_CPU", "TORCHINDUCTOR_CACHE_DIR"} <= names
    assert misspelt({**{name: "1" for name in names}, **REALISTIC}) == []
    assert all(any(k.startswith(word + "_") for k in (*VARIABLES, *SETTINGS)) for word in FAMILIES)
    cfg = dry_run("run_math.sh", **REALISTIC)  # and the launcher runs in it
    assert cfg["trainer"]["importance_sampling_level"] == "token"


ACCELERATE = ["-m", "accelerate.commands.launch"]


def test_dry_run_with_two_processes_shows_the_accelerate_command():
    code, stdout, err = launch_in_process("run_math.sh", DRY_RUN="1", NUM_PROCESSES="2", ACCELERATE_USE_CPU="true")
    assert code == 0, err
    assert re.search(r"^ *num_processes = 2$", stdout, re.M)
    cfg = json.loads(stdout.strip().splitlines()[-1])
    assert cfg["num_processes"] == 2 and cfg["accelerate_config"] is None
    command = cfg["launch_command"].split()
    assert command[1:] == [*ACCELERATE, "--num_processes", "2", "--multi_gpu", "-m", "tarpo.runs.launch", "math"]
    assert f"launch_command = {cfg['launch_command']}" in stdout
    # BATCH stays the completions per optimizer step: each process makes half of them; the run is the same run
    assert cfg["trainer"]["per_device_train_batch_size"] == 32
    assert os.path.basename(cfg["run_dir"]) == "math-qwen2.5-3b-tarpo-g8-bs64-lr5e-06-beta0.005-b02.2-s0"
    one = dry_run("run_math.sh")
    assert (one["num_processes"], one["launch_command"],
            one["trainer"]["per_device_train_batch_size"]) == (1, None, 64)


def test_an_accelerate_config_file_is_passed_on_with_its_process_count(tmp_path):
    from tarpo.runs.presets import resolve

    config = tmp_path / "ddp.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 4\n"
                      "mixed_precision: bf16\n")
    cfg = dry_run("run_gsm8k.sh", ACCELERATE_CONFIG=str(config))
    assert cfg["num_processes"] == 4 and cfg["trainer"]["per_device_train_batch_size"] == 8  # BATCH=32 over 4
    assert cfg["launch_command"].split()[1:] == [*ACCELERATE, "--num_processes", "4", "--config_file", str(config),
                                                 "-m", "tarpo.runs.launch", "gsm8k"]
    assert resolve("gsm8k", {"ACCELERATE_CONFIG": str(config), "NUM_PROCESSES": "2"}).num_processes == 2
    config.write_text("distributed_type: [\n")
    with pytest.raises(ValueError, match="ACCELERATE_CONFIG=.*ddp.yaml: not an accelerate config file"):
        resolve("gsm8k", {"ACCELERATE_CONFIG": str(config)})
    # sharded: FSDP2 only (tarpo.training.sharding); FSDP1 and ZeRO-3 are refused before anything loads
    config.write_text("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n  fsdp_version: 1\n")
    with pytest.raises(ValueError, match="ddp.yaml: FSDP version 1; TARPO shards with FSDP2"):
        resolve("gsm8k", {"ACCELERATE_CONFIG": str(config)})
    config.write_text("distributed_type: DEEPSPEED\nnum_processes: 4\ndeepspeed_config:\n  zero_stage: 3\n")
    with pytest.raises(ValueError, match="ddp.yaml: DeepSpeed ZeRO-3; TARPO shards with FSDP2"):
        resolve("gsm8k", {"ACCELERATE_CONFIG": str(config)})


def test_several_processes_need_cuda_or_accelerate_use_cpu(monkeypatch):
    from tarpo.training.distributed import cpu_requested
    from dataclasses import replace

    from tarpo.runs.launch import check_processes
    from tarpo.runs.presets import resolve

    two, four = (resolve("math", {"NUM_PROCESSES": str(n)}) for n in (2, 4))
    with pytest.raises(ValueError, match="NUM_PROCESSES=2: no CUDA device.*ACCELERATE_USE_CPU=true"):
        check_processes(two, devices=0, cpu=False)
    with pytest.raises(ValueError, match="NUM_PROCESSES=4: 4 processes on this machine, which has 2 CUDA device"):
        check_processes(four, devices=2, cpu=False)
    check_processes(two, devices=2, cpu=False)
    check_processes(replace(four, num_machines=2), devices=2, cpu=False)  # 2 a machine
    check_processes(resolve("math", {}), devices=0, cpu=False)
    check_processes(two, devices=0, cpu=True)  # CI: processes on the CPU, gloo
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    assert cpu_requested() is False
    for value, cpu in (("true", True), ("1", True), ("False", False)):
        monkeypatch.setenv("ACCELERATE_USE_CPU", value)
        assert cpu_requested() is cpu
    monkeypatch.setenv("ACCELERATE_USE_CPU", "cpu")
    with pytest.raises(ValueError, match="ACCELERATE_USE_CPU='cpu': must be true or false"):
        cpu_requested()
    monkeypatch.delenv("ACCELERATE_USE_CPU")
    import torch
    if not torch.cuda.is_available():  # the launcher refuses before anything loads, naming the variable
        code, _, err = launch_in_process("run_gsm8k.sh", NUM_PROCESSES="2")
        assert code == 2 and "NUM_PROCESSES=2: no CUDA device" in err


def tiny_model_folder(path):
    tok = char_tokenizer()
    tiny_causal_lm(tok, "qwen2", seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_several_processes_train_then_evaluate_through_accelerate_launch(tmp_path, monkeypatch):
    """The launching process runs the training processes, then the evaluation, with one accelerate prefix."""
    import tarpo.runs.launch as launcher
    from tarpo.runs import training_run

    for name in ("RANK", "LOCAL_RANK", launcher.LAUNCHED):
        monkeypatch.delenv(name, raising=False)
    env = dict(MODEL=tiny_model_folder(tmp_path / "tiny"), OUT_DIR=str(tmp_path / "runs"), NUM_PROCESSES="2",
               ACCELERATE_USE_CPU="true", EVAL="1", EVAL_N="2", DRY_RUN="0")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    ran = []
    monkeypatch.setattr(launcher, "run_command", lambda cmd, env, *a, **k: ran.append((cmd, env)) or 0)
    monkeypatch.setattr(training_run, "train", lambda *a, **k: pytest.fail("the launching process trained"))
    assert launcher.main(["gsm8k"]) == 0
    (train_cmd, train_env), (eval_cmd, eval_env) = ran
    prefix = [launcher.sys.executable, *ACCELERATE, "--num_processes", "2", "--multi_gpu"]
    assert train_cmd == [*prefix, "-m", "tarpo.runs.launch", "gsm8k"] and train_env[launcher.LAUNCHED] == "1"
    run = tmp_path / "runs" / "gsm8k-tiny-tarpo-g4-bs32-lr5e-06-beta0.005-b04.6-s0"
    assert eval_cmd[:len(prefix) + 3] == [*prefix, "-m", "tarpo.cli", "eval"]
    assert eval_cmd[eval_cmd.index("--adapter") + 1] == str(run / "adapter")
    assert eval_cmd[eval_cmd.index("--out") + 1] == str(run / "eval") and launcher.LAUNCHED not in eval_env
    assert not run.exists()  # the launching process writes nothing itself

    # in the launched processes: every one trains, none evaluates (the launching process does), rank 0 alone prints
    monkeypatch.setenv(launcher.LAUNCHED, "1")
    trained = []
    monkeypatch.setattr(training_run, "train", lambda cfg, args, ident, signals=None: trained.append(
        cfg.trainer["per_device_train_batch_size"]) or str(run / "adapter"))
    monkeypatch.setattr(launcher, "evaluate", lambda *a, **k: pytest.fail("a launched process evaluated"))
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        assert launcher.main(["gsm8k"]) == 0
    assert trained == [16, 16] and len(ran) == 2


def test_a_starter_stopped_outside_the_training_steps_ends_with_the_requeue_status(tmp_path, monkeypatch, capsys):
    """With several processes: a stop signal while they load (none has made the run folder, none leaves a marker)
    ends the starter with 75 and its line, and no evaluation (before: status 0, and EVAL=1 evaluated an adapter that
    was never saved); one during the evaluation, which it ends (SIGTERM: the agent passes it on), with 75 too;
    an evaluation that finished whatever came ends with its own status."""
    import tarpo.runs.launch as launcher

    for name in ("RANK", "LOCAL_RANK", launcher.LAUNCHED):
        monkeypatch.delenv(name, raising=False)
    for key, value in dict(MODEL=tiny_model_folder(tmp_path / "tiny"), OUT_DIR=str(tmp_path / "runs"),
                           NUM_PROCESSES="2", ACCELERATE_USE_CPU="true", EVAL="1", DRY_RUN="0").items():
        monkeypatch.setenv(key, value)
    calls = []

    def run_command(cmd, env, stops=(), received=None, stop_as_term=False, signalled=()):
        name = "tarpo.cli" if "tarpo.cli" in cmd else "tarpo.runs.launch"
        calls.append((name, stop_as_term))
        if name in signalled:
            received.append("SIGTERM")
            return evaluation_status if stop_as_term else 0
        return 0
    monkeypatch.setattr(launcher, "run_command", lambda *a, **k: run_command(*a, **k, signalled=signalled))
    signalled, evaluation_status = {"tarpo.runs.launch"}, 143  # the evaluation ended by the SIGTERM passed on
    assert launcher.main(["gsm8k"]) == 75 and calls == [("tarpo.runs.launch", False)]
    assert ("tarpo launch: stopped by SIGTERM before training ended: nothing new was saved; run the same command "
            "again to start it again (exit status 75)") in capsys.readouterr().out
    calls.clear()
    signalled = {"tarpo.cli"}
    assert launcher.main(["gsm8k"]) == 75 and calls == [("tarpo.runs.launch", False), ("tarpo.cli", True)]
    assert "stopped by SIGTERM" in capsys.readouterr().out
    evaluation_status = 0  # the evaluation finished before the signal reached it: its own status, no stop line
    assert launcher.main(["gsm8k"]) == 0 and "stopped by" not in capsys.readouterr().out


def test_the_main_process_is_rank_0(monkeypatch):
    from tarpo.runs.launch import process_rank

    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert process_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert process_rank() == 1
    monkeypatch.setenv("RANK", "0")  # the global rank decides (node 0's first process)
    assert process_rank() == 0


def test_hub_model_that_cannot_load_without_cuda_points_to_the_demo_and_writes_nothing(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = launch_in_process("run_gsm8k.sh", MODEL="nobody-has/this-model", OUT_DIR=str(tmp_path / "runs"))
    assert code == 2, err[-2000:]
    assert "MODEL=nobody-has/this-model: cannot be loaded" in err and "run_demo.sh" in err
    assert not (tmp_path / "runs").exists()


def big_model_folder(path):
    """A random Llama of 106M parameters (most of them in a 64,000-token embedding and head, so that it
    trains fast) whose tokenizer has no pad token, and whose EOS differs between the tokenizer
    (<|im_end|>), config.json (<|endoftext|>) and generation_config.json (both)."""
    from transformers import GenerationConfig
    tok = char_tokenizer()
    tok.pad_token = None
    model = tiny_causal_lm(tok, "llama", hidden_size=768, layers=2, heads=12, kv_heads=4, intermediate_size=1024,
                           vocab_size=64000)
    model.config.eos_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    model.generation_config = GenerationConfig(eos_token_id=[tok.eos_token_id, model.config.eos_token_id])
    assert sum(p.numel() for p in model.parameters()) > 100_000_000
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@needs_data
def test_a_local_model_above_100m_parameters_trains_on_cpu_after_printing_an_estimate(tmp_path):
    import torch
    from transformers import AutoTokenizer
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    folder = big_model_folder(tmp_path / "big")
    assert AutoTokenizer.from_pretrained(folder).pad_token is None
    code, out, err = launch_in_process(  # the bash layer: test_gsm8k_launcher_end_to_end_with_a_tiny_model...
        "run_gsm8k.sh", MODEL=folder, DATA_PATH=os.path.join(DATA, "gsm8k"), OUT_DIR=str(tmp_path / "runs"),
        TRAIN_LIMIT="4", MAX_STEPS="2", BATCH="4", GROUP_SIZE="2", MAX_PROMPT_LENGTH="400", MAX_COMPLETION_LENGTH="8",
        LORA_R="4", LORA_ALPHA="8")
    assert code == 0, out[-2000:] + err[-3000:]
    estimate = re.search(r"CPU estimate: (\d+) s a step \(4 completions of up to 8 tokens.*2 steps: (\d+) s", out)
    assert estimate and out.index("CPU estimate") < out.index("adapter and router saved"), out[-2000:]
    assert 0 < int(estimate[1]) <= int(estimate[2])
    (run,) = (tmp_path / "runs").iterdir()
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "loss" in s] == [1, 2]
    assert (run / "adapter" / "router.safetensors").exists()


def test_a_cpu_run_longer_than_cpu_max_hours_is_refused_before_anything_is_written(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
                            for i in range(50)))
    code, out, err = launch_in_process("run_gsm8k.sh", MODEL=tiny_model_folder(tmp_path / "tiny"), DATA_PATH=str(data),
                                       OUT_DIR=str(tmp_path / "runs"), BATCH="8", GROUP_SIZE="4", MAX_STEPS="100000",
                                       CPU_MAX_HOURS="0.001")
    assert code == 2, out[-2000:] + err[-2000:]
    assert "CPU estimate:" in out and "100000 steps" in out
    assert "CPU_MAX_HOURS=0.001: this run would take about" in err and "raise CPU_MAX_HOURS" in err
    assert not (tmp_path / "runs").exists()


class SoftSpans(HTMLParser):
    def __init__(self):
        super().__init__()
        self.soft, self.titles = 0, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "span" and attrs.get("class") == "soft":
            self.soft += 1
            self.titles.append(attrs.get("title", ""))


@needs_data
def test_gsm8k_launcher_end_to_end_with_a_tiny_model_then_plot_and_case(tmp_path):
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, "qwen2", seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    res = launch("run_gsm8k.sh", timeout=600, MODEL=str(tmp_path / "tiny"), DATA_PATH=os.path.join(DATA, "gsm8k"),
                 OUT_DIR=str(tmp_path / "runs"), TRAIN_LIMIT="8", MAX_STEPS="2", BATCH="8", GROUP_SIZE="4",
                 MAX_PROMPT_LENGTH="400", MAX_COMPLETION_LENGTH="16", ACTION_BIAS="0,0", LORA_R="4", LORA_ALPHA="8",
                 EVAL="1", EVAL_N="2", EVAL_LIMIT="3", EVAL_DATA_DIR=DATA)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name == "gsm8k-tiny-tarpo-g4-bs8-lr5e-06-beta0.005-b00-s0"
    launched = json.loads((run / "launch_config.json").read_text())
    assert launched["trainer"]["max_steps"] == 2
    import torch
    from tarpo.config import TarpoConfig
    saved = torch.load(run / "adapter" / "training_args.bin", weights_only=False)  # the Trainer's record of the run
    assert saved.to_dict() == TarpoConfig(**launched["trainer"]).to_dict()  # every field
    assert (run / "adapter" / "adapter_config.json").exists() and (run / "adapter" / "router.safetensors").exists()
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(s.get("rewards/correct_gsm8k/timeouts") == 0 for s in steps if "loss" in s)  # counted, none here
    results = json.loads((run / "eval" / "gsm8k.results.json").read_text())
    assert results["system"] == "TARPO" and results["metrics"]["questions"] == 3 and results["n"] == 2

    png = tmp_path / "curves.png"
    assert cli(["plot", str(run), str(run / "metrics.jsonl"), "--labels", "a,b", "--out", str(png)]) == 0
    import matplotlib.image
    img = matplotlib.image.imread(png)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 400

    html = tmp_path / "case.html"
    assert cli(["case", "--model", str(tmp_path / "tiny"), "--adapter", str(run / "adapter"), "--task", "gsm8k",
                "--data-dir", DATA, "--ids", "0,1", "--n", "3", "--max-new-tokens", "16", "--out", str(html)]) == 0
    text = html.read_text()
    parser = SoftSpans()
    parser.feed(text)
    counted = sum(int(n) for n in re.findall(r"soft steps (\d+)", text))
    assert parser.soft == counted > 0  # one highlighted span per soft step
    assert all(" | " in t or t.count(" ") == 1 for t in parser.titles)  # hover: top-k tokens and weights
    assert text.count('class="s"') == 6 and "advantage" in text


@needs_data
def test_missing_evaluation_data_is_reported_before_training():
    code, _, err = launch_in_process("run_dapo.sh", DRY_RUN="1", EVAL="1", EVAL_DATA_DIR=DATA)  # no GPQA there
    assert code == 2 and "no folder for gpqa_diamond" in err


def test_the_learning_check_reports_a_crash_as_a_crash_and_a_stop_as_a_stop(tmp_path, monkeypatch):
    """Side by side under a deadline (as the GPU calls run it): the run that crashed keeps its exit status, the one
    the deadline stopped is None; both logs are closed (before: every status None once any stop happened)."""
    from tarpo.runs import side_by_side

    fake = tmp_path / "fake-python"  # stands in for the launcher: crashes or runs past the deadline
    fake.write_text('#!/bin/sh\necho "run $RUN_NAME"\n[ "$RUN_NAME" = crash ] && exit 3\nexec sleep 60\n')
    fake.chmod(0o755)
    monkeypatch.setattr(side_by_side.sys, "executable", str(fake))
    envs = {"crash": {"RUN_NAME": "crash"}, "slow": {"RUN_NAME": "slow"}}
    status = side_by_side.run_side_by_side(envs, str(tmp_path), deadline=__import__("time").time() + 3)
    assert status == {"crash": 3, "slow": None}
    assert (tmp_path / "crash.log").read_text() == "run crash\n"


def test_the_launcher_forwards_a_stop_signal_to_its_training_processes(tmp_path):
    """A stop signal sent to the launcher (``run_command``, as a scheduler sends it to the job's first process) goes
    to the training processes below the agent, not to the agent: each worker saves and stops; the agent, which
    would die of a USR1 and leave its workers running, is not signalled. The workers here run ``-m``-less scripts
    whose command line names the launch module, as ``accelerate launch``'s workers do."""
    import signal
    import time

    worker = ("import signal, sys, time, os\n"
              "signal.signal(signal.SIGUSR1, lambda *a: (open(sys.argv[2], 'w').write('stopped'), sys.exit(75)))\n"
              "open(sys.argv[2] + '.ready', 'w').close()\n"
              "time.sleep(60)\n")
    agent = ("import signal, subprocess, sys\n"
             f"signal.signal(signal.SIGUSR1, lambda *a: open({str(tmp_path / 'agent')!r}, 'w').write('signalled'))\n"
             f"procs = [subprocess.Popen([sys.executable, {str(tmp_path / 'worker.py')!r}, 'tarpo.runs.launch', "
             f"{str(tmp_path)!r} + f'/worker{{i}}']) for i in range(2)]\n"
             "sys.exit(max(p.wait() for p in procs))\n")
    (tmp_path / "worker.py").write_text(worker)
    (tmp_path / "agent.py").write_text(agent)
    driver = ("import os, signal, sys; from tarpo.runs.processes import run_command; got = []; "
              f"status = run_command([sys.executable, {str(tmp_path / 'agent.py')!r}], dict(os.environ), "
              "stop_signals=(signal.SIGUSR1,), received=got); print(status, got)")
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not all((tmp_path / f"worker{i}.ready").exists() for i in range(2)):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=60)
    assert out.split("\n")[-2] == "75 ['SIGUSR1']", out
    assert all((tmp_path / f"worker{i}").read_text() == "stopped" for i in range(2))
    assert not (tmp_path / "agent").exists()


def test_an_evaluation_that_exits_0_without_results_is_reported_failed(tmp_path, monkeypatch):
    """The real-model check's evaluations: one that exits 0 but leaves no readable results file is a failure in the
    summary, not an exception that stops the check before learning.json is written."""
    import json as _json

    from tarpo.runs import learning_check

    fake = tmp_path / "fake-python"  # stands in for tarpo eval: the base writes its results, the others nothing
    fake.write_text('#!/bin/sh\nfor a in "$@"; do last=$prev; prev=$a; done\n'
                    'case "$*" in *eval-base*) mkdir -p "$prev" && printf \'%s\' \'{"metrics": {"pass@1": 0.1, '
                    '"accuracy_ci95": 0.05, "soft_ratio": 0}}\' > "$prev/arith_one.results.json";; esac\nexit 0\n')
    fake.chmod(0o755)
    monkeypatch.setattr(learning_check.sys, "executable", str(fake))
    results = learning_check.evaluate_before_after("smollm2-135m", str(tmp_path), ["grpo"], questions=2, n=1)
    assert results["base"]["pass@1"] == 0.1
    assert "failed" in results["grpo"] and "unreadable" in results["grpo"]["failed"]
    assert _json.dumps(results)  # what learning.json holds


COMMANDS = ("tarpo/runs/launch.py", "tarpo/cli/__main__.py", "tarpo/runs/learning_check.py", "tarpo/runs/demo.py",
            "tarpo/runs/paper_mini.py", "tarpo/models/offline.py")


@pytest.mark.parametrize("asked", [True, False], ids=["skipped", "default"])
def test_a_command_ends_without_the_final_collection_over_what_it_made(asked):
    """tarpo.process_exit: an object in a reference cycle alive at exit is left to the operating system where the
    process asked (its finalizer never runs), and collected by the interpreter's last collection where it did not;
    every command's ``__main__`` asks, first."""
    code = ("import gc, sys\nfrom tarpo.process_exit import skip_the_final_collection\n"
            "if sys.argv[1] == '1':\n    skip_the_final_collection()\n"
            "gc.disable()  # no automatic collection before the exit's\n"
            "class Cycle:\n    def __del__(self):\n        print('collected', flush=True)\n"
            "c = Cycle()\nc.me = c\ndel c\n")
    res = subprocess.run([sys.executable, "-c", code, str(int(asked))], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, check=True)
    assert res.stdout == ("" if asked else "collected\n")
    for path in COMMANDS:
        text = open(os.path.join(ROOT, path)).read()
        main = text[text.index('if __name__ == "__main__":'):].splitlines()
        # first in the block, or through the console script's entry point, which calls it first
        assert main[1].strip() == "sys.exit(command())" or "skip_the_final_collection()" in main[2], (path, main[:3])
    assert '"tarpo = tarpo.cli.__main__:command"' in open(os.path.join(ROOT, "setup.py")).read()  # the console script
    from tarpo.cli.__main__ import command
    assert "skip_the_final_collection()" in inspect.getsource(command).splitlines()[4]  # before main()
