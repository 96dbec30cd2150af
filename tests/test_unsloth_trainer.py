"""The launchers' default GPU path, Unsloth, trained end to end on Unsloth's own code (on the CPU), against
transformers + PEFT from the same weights.

``tests/workers/trainer_worker.py`` runs ``python -m tarpo.runs.launch gsm8k`` in a process of its own, once
per backend, for TARPO and HRPO on a tiny Qwen2 and a tiny Llama-3.1 (llama3 rope scaling): the gsm8k
preset (LoRA r 32 on q/k/v/o, gradient checkpointing, 8-bit AdamW), 4 optimizer steps of 2 micro-batches,
a checkpoint every 2 steps, then a resume from ``checkpoint-2`` in a new run folder and one more step.
Unsloth loads through ``FastLanguageModel.from_pretrained`` and ``get_peft_model`` (the launcher's
``training_policy``), with ``use_gradient_checkpointing="unsloth"`` (512-token sequences: its offloading
checkpoint function), ``tarpo.patches`` and its rewrite of the Trainer's loop; its GPU-only pieces are
stood in for by ``tests/workers/unsloth_cpu.py`` (the list: docs/gpu-path.md).

Tolerances, fp32: at step 1 both backends start from the same tensors and decode the same rollout (keyed
noise), so the loss and every gradient agree to fp32 rounding of different operation orders (measured
4e-7 relative; allowed 1e-5). From step 2 on they also carry the 8-bit optimizer's rounding: bitsandbytes
stores Adam's moments in 8-bit blocks, and a gradient difference of 1e-7 can move an element's moment to
the next code, which changes its update by about 1% of the learning rate (measured: at most 1.0% of the
rate, in one element). So parameters agree within 3% of the learning rate per step taken, and later
gradients within 5e-3 relative (measured at most 5.1e-4).
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import DATA, TINY, TINY_LLAMA, needs
from tarpo.runs import demo
from test_unsloth_cpu import SITE

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "trainer_worker.py")
COMPARED = ["qwen2-tarpo", "qwen2-hrpo", "llama-tarpo", "llama-hrpo"]  # fp32: the backends step by step
FUSED = "llama-tarpo-bf16"  # bf16 weights, all linear layers: Unsloth's fused LoRA functions
GPU_CHOICE = "qwen2-tarpo-gpu-choice"  # ENGINE=auto choosing as on a GPU (Unsloth only)
LEARNING_CHECK = "warm-tarpo-learning-check"  # tarpo.runs.learning_check's run of TARPO, its first 2 steps (Unsloth)
STEPS = 4  # run A's optimizer steps (tests/workers/trainer_worker.py STEPS): 8-bit Adam's drift from step 2 on

pytestmark = [needs("gsm8k"), pytest.mark.skipif(not os.path.isdir(os.path.join(SITE, "unsloth")),
                                                 reason=f"Unsloth for CPU tests is not installed in {SITE}")]


def rate(name: str) -> float:
    """The learning rate of a tensor's parameter group in the worker's runs (LR, ROUTER_LR, HRPO_LR)."""
    return 1e-2 if "tarpo_router" in name or "tarpo_soft_input" in name else 1e-3


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tarpo.models.tiny import random_model_dir

    root = tmp_path_factory.mktemp("unsloth_trainer")
    for arch, config in (("qwen2", TINY), ("llama", TINY_LLAMA)):
        random_model_dir(str(root / "models" / arch), config, torch.float32, arch=arch)
    # the learning check's model: the demo's warm-start folder (its BPE tokenizer), one supervised step is enough
    shutil.copytree(demo.warm_start(str(root / "cache"), sft_steps=1, seed=0, noise=0.4), root / "models" / "warm")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.path.join(HERE, "workers"),
               TARPO_COMPILE_BACKEND="aot_eager")  # the compiled case traces the step as tests/conftest.py does
    common = ["--model-root", str(root / "models"), "--data", os.path.join(DATA, "gsm8k")]
    un, hf = str(root / "unsloth.pt"), str(root / "hf.pt")
    for cmd, extra in (
            (["--backend", "unsloth", "--unsloth-on-cpu", "--out", un],
             dict(UNSLOTH_ALLOW_CPU="1", UNSLOTH_COMPILE_LOCATION=str(root / "unsloth_cache"),
                  PYTHONPATH=os.pathsep.join([SITE, os.path.join(HERE, "workers")]))),
            (["--backend", "hf", "--out", hf, "--init-from", un, "--cases", *COMPARED, FUSED], {})):
        res = subprocess.run([sys.executable, WORKER, *common, *cmd], capture_output=True, text=True, timeout=900,
                             env={**env, **extra}, cwd=str(root))
        assert res.returncode == 0, res.stderr[-6000:]
    return torch.load(un, weights_only=False), torch.load(hf, weights_only=False)


@pytest.mark.parametrize("case", COMPARED)
def test_unsloth_trains_what_transformers_trains(runs, case):
    un, hf = (r[case]["A"] for r in runs)
    assert sorted(un["grads"]) == sorted(hf["grads"]) == list(range(1, STEPS + 1))
    names = sorted(n for n in hf["initial"] if n != "checkpointing")
    assert names == sorted(n for n in un["initial"] if n != "checkpointing")
    assert any("lora_A" in n for n in names) and any("tarpo_router" in n or "tarpo_soft_input" in n for n in names)
    # exact: the hf run copies the Unsloth run's initial tensors
    assert all(np.array_equal(un["initial"][n], hf["initial"][n]) for n in names)  # the same start
    assert un["initial"]["checkpointing"] is False and hf["initial"]["checkpointing"] is True  # Unsloth's own
    for step in range(1, STEPS + 1):
        assert abs(un["loss"][step] - hf["loss"][step]) <= 1e-5, (step, un["loss"][step], hf["loss"][step])
        grads = {n: rel(un["grads"][step][n], hf["grads"][step][n]) for n in names}
        assert max(grads.values()) <= (1e-5 if step == 1 else 5e-3), (step, max(grads.items(), key=lambda kv: kv[1]))
        drift = {n: np.abs(un["params"][step][n] - hf["params"][step][n]).max() / rate(n) for n in names}
        assert max(drift.values()) <= 0.03 * step, (step, max(drift.items(), key=lambda kv: kv[1]))
    last, first = hf["params"][STEPS], hf["initial"]
    # exact: any change at all counts as trained
    assert all(not np.array_equal(last[n], first[n]) for n in names)  # every LoRA, router and gate tensor trained


@pytest.mark.parametrize("backend", ["unsloth", "hf"])
@pytest.mark.parametrize("case", [*COMPARED, FUSED])
def test_a_resumed_run_continues_exactly_and_nothing_grows(runs, case, backend):
    """Run B resumed from run A's checkpoint-2 and made step 3 as run A did, to the bit; in run A the hooks,
    buffers, checkpoint functions, compiled graphs and live tensors are the same after steps 2 and 4, and the
    rollouts left every module's checkpointing as the trainer set it up."""
    from growth import differences

    a, b = runs[0 if backend == "unsloth" else 1][case]["A"], runs[0 if backend == "unsloth" else 1][case]["B"]
    # exact: run B resumes from run A's checkpoint-2 and replays step 3's ops
    assert sorted(b["grads"]) == [3] and a["loss"][3] == b["loss"][3]
    for part in ("grads", "params"):
        # exact: the same replay of step 3
        assert all(np.array_equal(a[part][3][n], b[part][3][n]) for n in a[part][3]), part
    taken = a["growth"]
    assert differences(taken[2], taken[STEPS]) == {}
    assert taken[2]["checkpointing"] == taken[0]["checkpointing"]


def test_on_a_gpu_auto_rolls_unsloth_models_out_on_the_compiled_engine(runs):
    """``ENGINE=auto`` choosing as on a GPU, on the Unsloth backend: every rollout runs on the compiled engine
    (over the model's own tensors) from one graph compiled once under Unsloth's dynamo settings (which lift the
    recompile limit: a guard failing at every step would compile again at every step, unstopped), and the run
    trains what the eager engine's run (Unsloth's decode) trains: the same loss at step 1 within 1e-5 (the same
    rollout, keyed noise), and at every later step."""
    un = runs[0]
    compiled, eager = un[GPU_CHOICE]["A"], un["qwen2-tarpo"]["A"]
    assert compiled["engines"] == ["compiled"] * STEPS and set(eager["engines"]) == {"eager"}
    assert compiled["graphs"] == 1 and eager["graphs"] == 0  # exact: counts of compiled graphs
    lora_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    # exact: the same seeded initialisation in both runs
    assert np.array_equal(compiled["initial"][lora_a], eager["initial"][lora_a])
    assert abs(compiled["loss"][1] - eager["loss"][1]) <= 1e-5
    assert all(abs(compiled["loss"][s] - eager["loss"][s]) <= 1e-4
               for s in range(2, STEPS + 1)), (compiled["loss"], eager["loss"])


def test_the_learning_checks_first_steps_run_on_unsloths_path_from_the_demos_warm_start(runs):
    """The learning check (tarpo.runs.learning_check) on the GPU path's own code: Unsloth's loader on the demo's
    warm-start folder and its BPE tokenizer, the arith preset with the check's settings (LoRA on every linear layer,
    b0 = [2.2, 0]), Unsloth's training forward, the compiled engine chosen as on a GPU: one graph, every rollout on
    it, its log-probs the training forward's (fp32: rounding only), every trainable tensor changed in two steps."""
    run = runs[0][LEARNING_CHECK]["A"]
    assert run["engines"] == ["compiled"] * 2 and run["graphs"] == 1  # exact: counts
    assert sorted(run["loss"]) == [1, 2] and all(np.isfinite(v) for v in run["loss"].values())
    names = [n for n in run["initial"] if n != "checkpointing"]
    assert any("gate_proj.lora_A" in n for n in names) and any("tarpo_router" in n for n in names)
    assert max(run["logp_drift"].values()) < 1e-3, run["logp_drift"]
    # exact: any change at all counts as trained
    assert all(not np.array_equal(run["params"][2][n], run["initial"][n]) for n in names)


def test_unsloths_fused_lora_functions_train_under_the_trainer(runs):
    """bf16 weights and LoRA on every linear layer: Unsloth's fused q/k/v, o and SwiGLU-MLP autograd functions
    run in the rollouts' and the training forwards' place, and every trainable tensor changes."""
    case = runs[0][FUSED]
    assert all(n > 0 for n in case["fused"].values()), case["fused"]
    a = case["A"]
    names = [n for n in a["initial"] if n != "checkpointing"]
    assert any("gate_proj.lora_A" in n for n in names)
    assert all(np.isfinite(a["loss"][s]) for s in range(1, STEPS + 1))
    # exact: any change at all counts as trained
    assert all(not np.array_equal(a["params"][STEPS][n], a["initial"][n]) for n in names)


def test_unsloth_loads_the_model_the_user_named(runs):
    """``MODEL=Qwen/Qwen2.5-3B-Instruct`` reaches transformers as given: Unsloth's name mapper
    (``use_exact_model_name=False``, its default) loaded ``unsloth/Qwen2.5-3B-Instruct`` instead, which an
    offline cache of the user's model misses and whose config comes from another repository."""
    names = runs[0]["names"]
    assert names and set(names) == {"Qwen/Qwen2.5-3B-Instruct"}, names




@pytest.mark.parametrize("backend", ["unsloth", "hf"])
def test_no_attention_call_of_the_launchers_run_would_run_on_cudas_math_kernel(runs, backend):
    """Every SDPA call of run A (rollouts: prefill and decode steps; training forwards and their recompute
    under Unsloth's or transformers' checkpointing), against torch 2.11's kernel choice on an H100
    (tests/sdpa_rules.py); Unsloth choosing between enable_gqa and expanded K/V as it does on such a GPU."""
    from sdpa_rules import Call, on_math

    run = runs[0 if backend == "unsloth" else 1]
    for case in [*COMPARED, FUSED]:
        calls = [Call(*c) for c in run[case]["A"]["sdpa"]]
        assert any(c.requires_grad for c in calls) and any(c.query[2] < c.key[2] for c in calls), (case, calls[:3])
        assert on_math(calls) == [], (case, on_math(calls)[:3])

