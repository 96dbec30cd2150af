"""The launcher's training run on one backend, in a process of its own, recorded step by step.

``tests/test_unsloth_trainer.py`` runs this once with ``--backend unsloth --unsloth-on-cpu`` (Unsloth's
own Python code on the CPU, :mod:`unsloth_cpu`) and once with ``--backend hf`` (transformers + PEFT) from
the same saved weights, and compares what they wrote. For each case of :data:`CASES` it runs
``python -m tarpo.runs.launch gsm8k`` in this process (:func:`tarpo.runs.launch.main`: the presets, the
memory plan's micro-batch, ``training_policy``, ``TarpoTrainer``, checkpoints), twice:

- **run A**: ``MAX_STEPS=4``, a checkpoint every 2 steps; the loss, every trainable tensor's gradient
  (after clipping, before the optimizer) and value after each optimizer step; a :mod:`growth` snapshot
  when training begins and after steps 2 and 4;
- **run B**: a new run folder holding a copy of run A's ``checkpoint-2``; the launcher resumes from it and
  is stopped after step 3 (the same 4-step schedule), recorded the same way.

The learning check's case (``python -m tarpo.runs.launch arith`` with :mod:`tarpo.runs.learning_check`'s variables
on the demo's warm start, ``<root>/warm``) runs 2 steps of 16 completions, run A only.

Every run also records its SDPA calls (tests/sdpa_rules.py); on Unsloth, its choice between ``enable_gqa`` and
expanded K/V is made as on an H100 (:func:`unsloth_cpu.probe_sdpa_as_on_an_h100`).

The initial LoRA (and router) tensors of the Unsloth run are written to ``--init-out``; the transformers
run loads them with ``--init-from`` into the model it built, so that both start from the same point (each
backend draws LoRA A from its own RNG path). The reward is a stand-in with spread in every group (a random
model never answers a GSM8K question): the sum of the completion's character codes mod 7.

    python tests/workers/trainer_worker.py --backend unsloth --unsloth-on-cpu --model-root M --data D --out un.pt
    python tests/workers/trainer_worker.py --backend hf --model-root M --data D --init-from un.pt --out hf.pt
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(TESTS), TESTS]  # this checkout's tarpo; tests/ (checkout, growth)
from checkout import use_checkout_patches  # noqa: E402

LEARNING_CHECK = "warm-tarpo-learning-check"
# case -> (architecture, ALGO, launcher variables of its own). The fp32 cases compare the backends step by step;
# the bf16 one runs what only 16-bit weights get on Unsloth: its fused LoRA q/k/v, o and SwiGLU MLP functions
# (Llama: Unsloth fuses q/k/v only without q/k/v biases, so never for Qwen2).
CASES = {"qwen2-tarpo": ("qwen2", "tarpo", {}), "qwen2-hrpo": ("qwen2", "hrpo", {}),
         "llama-tarpo": ("llama", "tarpo", {}), "llama-hrpo": ("llama", "hrpo", {}),
         "llama-tarpo-bf16": ("llama", "tarpo", {"BF16": "1", "LORA_TARGETS": "all-linear"}),
         # ENGINE=auto as on a GPU (the engine choice told CUDA is there): the compiled engine, no resume
         "qwen2-tarpo-gpu-choice": ("qwen2", "tarpo", {}),
         # the learning check's first steps (tarpo.runs.learning_check): the demo's warm start (its BPE tokenizer) on
         # the arith preset with the check's variables, ENGINE=auto as on a GPU, no resume
         LEARNING_CHECK: ("warm", "tarpo", {})}
GPU_CHOICE = {"qwen2-tarpo-gpu-choice", LEARNING_CHECK}
STEPS, RESUME_AT, STOP_AT = 4, 2, 3


def launcher_env(model: str, data: str, run_dir: str, algo: str, backend: str) -> dict:
    """The launcher's variables for a short CPU run; everything else is the gsm8k preset's (LoRA r 32 on
    q/k/v/o, paged 8-bit AdamW (8-bit AdamW without CUDA), gradient checkpointing, the paper's rates).
    Prompts of 496 tokens and 16 new ones: a 512-token sequence, where Unsloth's checkpointing offloads."""
    return {"MODEL": model, "ALGO": algo, "BACKEND": backend, "DATA_PATH": data, "TRAIN_LIMIT": "32",
            "OUT_DIR": os.path.dirname(run_dir), "RUN_NAME": os.path.basename(run_dir), "BATCH": "8",
            "GROUP_SIZE": "4", "MICRO_BATCH": "4", "MAX_STEPS": str(STEPS), "SAVE_STEPS": str(RESUME_AT),
            "MAX_PROMPT_LENGTH": "496", "MAX_COMPLETION_LENGTH": "16", "CPU_MAX_HOURS": "1", "EVAL": "0",
            "LR": "1e-3", "ROUTER_LR": "1e-2", "HRPO_LR": "1e-2", "ACTION_BIAS": "0,0", "WARMUP": "0"}


class Recorder:
    """A TrainerCallback: loss, gradients and values of the trainable tensors at each step; growth snapshots."""

    def __init__(self, stop_at=None):
        from growth import GrowthProbe
        self.stop_at, self.grads, self.params, self.probe = stop_at, {}, {}, GrowthProbe([RESUME_AT, STEPS])

    def callback(self):
        from transformers import TrainerCallback
        recorder = self

        class Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kw):
                recorder.probe.on_train_begin(args, state, control, model=model)

            def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
                recorder.grads[state.global_step + 1] = {n: p.grad.detach().float().numpy().copy() for n, p in
                                                         model.named_parameters() if p.requires_grad}

            def on_step_end(self, args, state, control, model=None, **kw):
                recorder.params[state.global_step] = trainable(model)
                recorder.probe.on_step_end(args, state, control, model=model)
                if state.global_step == recorder.stop_at:
                    control.should_training_stop = True
        return Callback()


def trainable(model) -> dict:
    """name -> value of each trainable tensor, as numpy arrays (so that the growth snapshots, which count
    live tensors, do not count the records)."""
    return {n: p.detach().float().numpy().copy() for n, p in model.named_parameters() if p.requires_grad}


def instrument(recorder: Recorder, init: dict | None, initial_out: dict):
    """TarpoTrainer.__init__ wrapped: the recorder's callback added; the trainable tensors loaded from
    ``init`` (a run of the other backend) or written to ``initial_out``."""
    from tarpo.training.trainer import TarpoTrainer
    original = TarpoTrainer.__init__

    def init_and_record(self, *args, **kwargs):
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), recorder.callback()]
        original(self, *args, **kwargs)
        if init is not None:
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    if p.requires_grad:
                        p.copy_(torch.from_numpy(init[name]))
        initial_out.update(trainable(self.model))
        initial_out["checkpointing"] = self.args.gradient_checkpointing
    TarpoTrainer.__init__ = init_and_record
    return original


def spread_reward(prompts, completions, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]  # chat or plain completions
    return [float(sum(map(ord, t)) % 7) for t in texts]


def learning_check_env(model: str, run_dir: str, backend: str) -> dict:
    """The learning check's launcher variables for its run of TARPO (tarpo.runs.learning_check), cut to 2 steps of
    16 completions for the test's time."""
    from tarpo.runs import demo
    from tarpo.runs.learning_check import launcher_variables
    env = launcher_variables(demo.parse_args(["--steps", "2"]), model, os.path.dirname(run_dir), "tarpo")
    return {**env, "RUN_NAME": os.path.basename(run_dir), "BACKEND": backend, "BATCH": "16", "CPU_MAX_HOURS": "1"}


def run(env: dict, recorder: Recorder, init: dict | None, gpu_choice: bool = False, dataset: str = "gsm8k") -> dict:
    """The launcher's run; with ``gpu_choice``, ``ENGINE=auto`` chooses as on a GPU. Records which engine
    each rollout ran on and how many graphs dynamo compiled. The SDPA calls are recorded on the eager engine
    only: recorded inside the compiled step, each call would be a side effect that dynamo guards on (the
    list's length), a recompile at every step (Unsloth lifts dynamo's recompile limit, so nothing stops it)."""
    import contextlib

    import torch._dynamo.utils
    import tarpo.engine.rollout as rollout
    from sdpa_rules import recorded_sdpa
    from tarpo.engine.engine_choice import EngineChooser
    from tarpo.runs import launch
    from tarpo.tasks import graders
    from tarpo.training.trainer import TarpoTrainer

    initial: dict = {}
    original = instrument(recorder, init, initial)
    graders.reward_function = lambda task: spread_reward
    engines, compiled, eager, choose = [], rollout.compiled_generate, rollout._decode, EngineChooser.next
    rollout.compiled_generate = lambda *a, **k: engines.append("compiled") or compiled(*a, **k)
    rollout._decode = lambda *a, **k: engines.append("eager") or eager(*a, **k)
    if gpu_choice:
        EngineChooser.next = lambda self, cuda: choose(self, True)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    try:
        bound = [m for m in (sys.modules.get("unsloth.models.llama"),) if m is not None]  # its decode's own name
        with recorded_sdpa(*bound) if not gpu_choice else contextlib.nullcontext([]) as attention:
            status = launch.main([dataset])
    finally:
        TarpoTrainer.__init__ = original
        rollout.compiled_generate, rollout._decode, EngineChooser.next = compiled, eager, choose
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert status == 0, f"the launcher exited with {status}"
    metrics = [json.loads(line) for line in open(os.path.join(env["OUT_DIR"], env["RUN_NAME"], "metrics.jsonl"))]
    return {"initial": initial, "grads": recorder.grads, "params": recorder.params, "growth": recorder.probe.taken,
            "engines": engines, "sdpa": [tuple(c) for c in attention],
            "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs,
            "loss": {m["step"]: m["loss"] for m in metrics if "loss" in m},
            "reward": {m["step"]: m["reward"] for m in metrics if "reward" in m},
            "logp_drift": {m["step"]: m["logp_drift"] for m in metrics if "logp_drift" in m}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["hf", "unsloth"], required=True)
    ap.add_argument("--model-root", required=True, help="a folder holding one saved model per --arch (<root>/<arch>)")
    ap.add_argument("--data", required=True, help="the GSM8K folder (DATA_PATH)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--init-from", help="a file this script wrote for the other backend: start from its tensors")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--unsloth-on-cpu", action="store_true",
                    help="Unsloth's Python code on the CPU, its GPU-only pieces stood in for "
                         "(tests/workers/unsloth_cpu.py)")
    args = ap.parse_args(argv)

    use_checkout_patches()
    import tarpo.training.trainer  # noqa: F401  (TRL's own GRPOTrainer before Unsloth can replace it)
    unsloth_cpu = None
    if args.unsloth_on_cpu:
        import unsloth_cpu
        unsloth_cpu.install_training()
        unsloth_cpu.probe_sdpa_as_on_an_h100()
    reference = torch.load(args.init_from, weights_only=False) if args.init_from else None  # our own file
    out = {"backend": args.backend}
    for key in args.cases:
        arch, algo, extra = CASES[key]
        root = os.path.join(os.path.dirname(os.path.abspath(args.out)), f"{args.backend}-{key}")
        model = os.path.join(args.model_root, arch)
        init = None if reference is None or key not in reference else reference[key]["A"]["initial"]
        env = {**launcher_env(model, args.data, os.path.join(root, "a"), algo, args.backend), **extra}
        if key == LEARNING_CHECK:
            env = learning_check_env(model, os.path.join(root, "a"), args.backend)
        if args.unsloth_on_cpu:
            unsloth_cpu.FUSED_CALLS.update(dict.fromkeys(unsloth_cpu.FUSED, 0))
        out[key] = {"A": run(env, Recorder(), init, gpu_choice=key in GPU_CHOICE,
                             dataset="arith" if key == LEARNING_CHECK else "gsm8k")}
        if key not in GPU_CHOICE:  # run B: resumed from run A's checkpoint-2
            os.makedirs(os.path.join(root, "b"))
            shutil.copytree(os.path.join(root, "a", f"checkpoint-{RESUME_AT}"),
                            os.path.join(root, "b", f"checkpoint-{RESUME_AT}"))
            out[key]["B"] = run({**env, "RUN_NAME": "b"}, Recorder(STOP_AT), None)
        out[key]["fused"] = dict(unsloth_cpu.FUSED_CALLS) if args.unsloth_on_cpu else None
    if args.unsloth_on_cpu:  # the hub id a user gives MODEL, as it reaches Unsloth's loader
        out["names"] = unsloth_cpu.names_unsloth_loads("Qwen/Qwen2.5-3B-Instruct")
    tmp = args.out + ".tmp"
    torch.save(out, tmp)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    from tarpo.process_exit import skip_the_final_collection
    skip_the_final_collection()  # as the project's commands: no last collection over the imports
    sys.exit(main())
