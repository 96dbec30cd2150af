"""Helpers of benchmarks/gpu_session.sh, the short checks on a CUDA GPU (docs/gpu/README.md).

    python benchmarks/gpu_session.py model DIR SHAPE          # random weights of SHAPE (1.5b | 3b | tiny), bf16
    python benchmarks/gpu_session.py data DIR DATA [CACHE]    # GSM8K rows, MATH rows padded past 1,024 tokens (from
                                                              # DATA's gsm8k/train.jsonl and math/train.jsonl), and
                                                              # the demo's warm start (DIR/warm; from CACHE, made
                                                              # there if missing: about 3 minutes on a 2-core CPU)
    python benchmarks/gpu_session.py decode MODEL JSON [--tiny] # the compiled step: learned / all-hard / all-soft rows
    python benchmarks/gpu_session.py steps RUN_DIR JSON         # a launcher run's per-step figures beside its plan
    python benchmarks/gpu_session.py record JSON KEY VALUE      # merge one result into a call's JSON
    python benchmarks/gpu_session.py summary CALL JSON DEST     # the call's last line: one JSON object (below)

``summary call1``: ``{"learning": {"grpo": {first, last, rise, step_s, ...}, "tarpo": {...}}, ...}`` from the
learning check's folder ``DEST/learning`` (its ``learning.json``, or the runs' ``metrics.jsonl`` copies when it was
cut short); ``summary call2``: ``{"math": {plan_gib, micro_batch, steps: [{rollout_s, step_s, peak_gib,
reserved_gib, rollout_peak_gib}], ...}}`` from ``DEST/math.jsonl``, ``DEST/math_plan.json`` and the memory
sampler's ``DEST/memory.csv``. A figure not reached is ``null``.

``decode`` loads MODEL on the default backend (Unsloth on CUDA where installed), decodes a batch of 64
left-padded prompts with the compiled engine (CUDA graphs) under the trainer's autocast
(:func:`tarpo.engine.precision.mixed_precision`: bf16 LoRA products, as a training rollout runs them), and times
each decode step (``StepClock`` of benchmarks/bench_write_positions.py: the prefill apart) for the router's learned
bias (b0 = [2.2, 0]), then with every row hard and every row soft: the router's bias is changed in place,
so the captured graph is the same one. Its floor is the weight bytes over the device's measured copy
bandwidth (bytes read and written counted, as benchmarks/gpu_bench.py's floor): every weight read once a step.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from results_file import record  # noqa: E402


def make_model(root: str, shape: str) -> None:
    import torch

    from tarpo.models.tiny import QWEN25_3B, QWEN25_15B, random_model_dir
    from gpu_bench import TINY
    config = {"1.5b": QWEN25_15B, "3b": QWEN25_3B, "tiny": TINY}[shape]
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # a 3B init on the CPU takes a minute
        random_model_dir(root, config, torch.bfloat16)


def make_data(root: str, shared: str, cache: str = os.path.join("runs", "cache")) -> None:
    """:func:`write_rows`, and ``warm/``: the demo's warm-started model and tokenizer (3.7 MiB), for the learning
    check (made in ``cache`` if it is not there: about 2-3 minutes on a 2-core CPU)."""
    from tarpo.runs import demo
    d = demo.parse_args([])
    warm = demo.warm_start(cache, d.sft_steps, d.warm_seed, d.sft_noise, batch_size=d.sft_batch)
    write_rows(root, shared)
    shutil.rmtree(os.path.join(root, "warm"), ignore_errors=True)
    shutil.copytree(warm, os.path.join(root, "warm"))


def write_rows(root: str, shared: str) -> None:
    """``gsm8k.jsonl``: the first 64 GSM8K training rows. ``math_long.jsonl``: 16 MATH training rows whose
    problem is followed by filler, so that every prompt is cut to MAX_PROMPT_LENGTH (the paper's 1,024)."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(shared, "gsm8k", "train.jsonl")) as f, open(os.path.join(root, "gsm8k.jsonl"), "w") as g:
        for _, line in zip(range(64), f):
            g.write(line)
    filler = " ".join(f"Note {i}: the value of x{i} is {i * 7 % 97}." for i in range(400))
    with open(os.path.join(shared, "math", "train.jsonl")) as f, open(os.path.join(root, "math_long.jsonl"), "w") as g:
        for _, line in zip(range(16), f):
            row = json.loads(line)
            row["problem"] = filler + "\n\n" + row["problem"]
            g.write(json.dumps(row) + "\n")


def decode(model_dir: str, out: str, tiny: bool = False) -> None:
    import torch

    from bench_write_positions import StepClock
    from gpu_bench import copy_bandwidth, sync
    from tarpo.config import TarpoConfig
    from tarpo.engine.precision import mixed_precision
    from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate
    from tarpo.engine.soft_input import TOP_K_MIXTURE
    from tarpo.engine.router import Router
    from tarpo.engine.tagging import token_text_fn
    from tarpo.models.backends import make_backbone
    from tarpo.models.loading import load_tokenizer, resolve_backend, training_policy
    from tarpo.models.tiny import left_padded_prompts

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    batch, prompt_len, new_tokens = (4, 16, 8) if tiny else (64, 256, 256)
    backend = resolve_backend("auto")
    config = TarpoConfig(output_dir="/tmp/gpu-session-decode", lora_r=32, lora_alpha=64, bf16=cuda,
                         max_prompt_length=prompt_len, max_completion_length=new_tokens, report_to="none")
    t0 = time.perf_counter()
    model = training_policy(model_dir, config, backend, "bfloat16" if cuda else "float32")
    if backend == "hf":
        from peft import get_peft_model

        from tarpo.models.loading import lora_config
        model = get_peft_model(model.to(device), lora_config(config))
    model.eval()
    res = {"backend": backend, "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
           "load_s": time.perf_counter() - t0}
    tok = load_tokenizer(model_dir)
    router = Router(model.config.hidden_size, bias=[2.2, 0.0]).to(device)
    prompts, mask = left_padded_prompts(batch, prompt_len, model.config.vocab_size, tok.pad_token_id)
    prompts, mask = prompts.to(device), mask.to(device)
    spec = RolloutSpec(max_new_tokens=new_tokens, temperature=0.5, routing="learned", engine="compiled",
                       max_prompt_length=prompt_len, batch_size=batch)
    token_text = token_text_fn(tok)

    def rollout():
        """One rollout as the trainer runs it (its autocast); its seconds, the median decode step's ms."""
        backbone = make_backbone(model)
        sync()
        start = time.perf_counter()
        with StepClock(cuda) as clock, mixed_precision(backbone):
            policy = Policy(backbone, token_text, [tok.eos_token_id], tok.pad_token_id, router, TOP_K_MIXTURE)
            r = hybrid_generate(policy, prompts, mask, spec)
        sync()
        return time.perf_counter() - start, clock.step_ms(), r

    first, _, _ = rollout()  # compile + capture + one rollout
    for name, bias in (("learned", [2.2, 0.0]), ("hard", [30.0, -30.0]), ("soft", [-30.0, 30.0])):
        with torch.no_grad():
            router.proj.bias.copy_(torch.tensor(bias))
        times, steps, r = [], [], None
        for _ in range(3):
            t, step_ms, r = rollout()
            times.append(t)
            steps.append(step_ms)
        res[name] = {"rollout_s": statistics.median(times), "step_ms": statistics.median(steps),
                     "soft_ratio": float(r.is_soft.sum() / r.units.sum())}
        record(out, "decode", res)
    res["first_rollout_s"] = first
    res["compile_and_capture_s"] = first - res["learned"]["rollout_s"]
    res["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    res["copy_bandwidth"] = copy_bandwidth(device)
    # every weight read once per step, at the copy's rate (copy_bandwidth counts the bytes read and written)
    res["floor_ms"] = 1000 * res["weight_bytes"] / res["copy_bandwidth"]
    res["learned_over_floor"] = res["learned"]["step_ms"] / res["floor_ms"]
    res["soft_over_hard"] = res["soft"]["step_ms"] / res["hard"]["step_ms"]
    record(out, "decode", res)
    print(json.dumps(res, indent=1))


def steps(run_dir: str, out: str) -> None:
    """Per step of a launcher run: rollout, training (the step less its rollout), peak memory, hooks;
    beside the run's memory plan."""
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if '"loss"' in line]
    plan = json.load(open(os.path.join(run_dir, "launch_config.json")))["memory_plan"]
    keep = ("timing/rollout_s", "timing/step_s", "memory/peak_gib", "hooks/forward", "loss", "grad_norm",
            "soft_ratio", "completions/mean_units")
    table = []
    for r in rows:
        entry = {"step": r["step"], **{k: r[k] for k in keep if k in r}}
        if "timing/step_s" in r and "timing/rollout_s" in r:
            entry["train_s"] = r["timing/step_s"] - r["timing/rollout_s"]
        table.append(entry)
    engine = os.path.join(run_dir, "rollout_engine.json")
    res = {"steps": table, "plan": plan, "engine_choice": json.load(open(engine)) if os.path.exists(engine) else None}
    record(out, os.path.basename(run_dir.rstrip("/")), res)
    print(json.dumps(res, indent=1))


def _jsonl(path: str) -> list[dict]:
    """The records of a metrics.jsonl copy (a line cut by the copy is left out)."""
    rows = []
    if os.path.isfile(path):
        for line in open(path):
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def learning_summary(dest: str) -> dict:
    """call1's figures: the learning check's ``learning.json`` where it finished, else each run's figures from
    the ``learning-<algo>.jsonl`` copies (a check cut short); an algorithm with no step logged is ``null``."""
    from tarpo.runs.learning_check import ALGOS
    from tarpo.runs.learning_curves import summarize
    done = os.path.join(dest, "learning.json")
    if os.path.isfile(done):
        return json.load(open(done))["learning"]
    out = {}
    for algo in ALGOS:
        copy = os.path.join(dest, f"learning-{algo}.jsonl")
        if not os.path.isfile(copy):
            out[algo] = None
            continue
        with tempfile.TemporaryDirectory() as run:
            shutil.copy(copy, os.path.join(run, "metrics.jsonl"))
            out[algo] = summarize(run)
    return out


def memory_trace(path: str) -> dict | None:
    """The memory sampler's trace (``nvidia-smi --query-gpu=timestamp,memory.used`` every 0.5 s, MiB): its
    samples, the peak and the time of the peak since the first sample."""
    samples = []
    if os.path.isfile(path):
        for line in open(path):
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 2 and parts[1].replace(".", "", 1).isdigit():
                samples.append(float(parts[1]))
    if not samples:
        return None
    return {"samples": len(samples), "every_s": 0.5, "peak_gib": max(samples) / 1024,
            "peak_at_s": 0.5 * samples.index(max(samples)), "mib": samples}


def math_summary(dest: str) -> dict:
    """call2's figures: the memory plan, each logged step of the MATH run, the memory sampler's peak."""
    plan_file = os.path.join(dest, "math_plan.json")
    plan = (json.load(open(plan_file)).get("memory_plan") or {}) if os.path.isfile(plan_file) else {}
    steps = []
    for r in _jsonl(os.path.join(dest, "math.jsonl")):
        if "timing/step_s" not in r:
            continue
        step = {"step": r.get("step"), "rollout_s": r.get("timing/rollout_s"), "step_s": r.get("timing/step_s"),
                "peak_gib": r.get("memory/peak_gib"), "reserved_gib": r.get("memory/peak_reserved_gib"),
                "rollout_peak_gib": r.get("memory/rollout_peak_gib"), "units": r.get("completions/mean_units"),
                "soft_ratio": r.get("soft_ratio"), "logp_drift": r.get("logp_drift"),
                "logp_drift_max": r.get("logp_drift_max")}
        if step["step_s"] is not None and step["rollout_s"] is not None:
            step["train_s"] = step["step_s"] - step["rollout_s"]
        steps.append(step)
    trace = memory_trace(os.path.join(dest, "memory.csv"))
    compile_s = steps[0]["rollout_s"] - steps[1]["rollout_s"] if len(steps) > 1 and None not in (
        steps[0]["rollout_s"], steps[1]["rollout_s"]) else None
    return {"plan_gib": plan.get("peak_gib"), "plan_train_gib": plan.get("train_gib"),
            "plan_rollout_gib": plan.get("rollout_gib"), "micro_batch": plan.get("micro_batch"),
            "backend": plan.get("backend"), "engine": plan.get("engine"), "steps": steps,
            "compile_and_capture_s": compile_s,
            "sampler_peak_gib": None if trace is None else trace["peak_gib"],
            "sampler_samples": None if trace is None else trace["samples"]}


def summary(call: str, out: str, dest: str) -> dict:
    """The call's last line (also recorded in ``out`` under ``summary``)."""
    res = {"call": call, **{k: v for k, v in (json.load(open(out)) if os.path.isfile(out) else {}).items()
                            if k in ("where", "torch")}}
    if call == "call1":
        res["learning"] = learning_summary(dest)
    elif call == "call2":
        res["math"] = math_summary(dest)
    record(out, "summary", res)
    return res


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "model":
        make_model(*rest)
    elif cmd == "data":
        make_data(*rest)
    elif cmd == "summary":
        print(json.dumps(summary(*rest)))
    elif cmd == "decode":
        decode(rest[0], rest[1], tiny="--tiny" in rest)
    elif cmd == "steps":
        steps(*rest)
    elif cmd == "record":
        record(rest[0], rest[1], json.loads(rest[2]))
    else:
        sys.exit(f"unknown command {cmd}: see the head of {__file__}")
