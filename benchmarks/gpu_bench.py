"""GPU benchmarks: the Unsloth path against the transformers path, one report.

    python benchmarks/gpu_bench.py --report docs/gpu/2026-11-22-H100.md [--tests-log gpu_tests.log]
    python benchmarks/gpu_bench.py --tiny --report /tmp/smoke.md      # a CPU smoke run of the code paths
    python benchmarks/gpu_bench.py --only rollout-hf --json r.json    # one benchmark (benchmarks/gpu_check.sh)
    python benchmarks/gpu_bench.py --render results.json --report docs/gpu/<date>-<gpu>.md

On a random-init model with the Qwen2.5-1.5B configuration (``--shape 3b``: Qwen2.5-3B; bf16; no
weights needed):

- rollout tokens/s of the Unsloth path (tarpo.patches), the transformers path (the eager
  engine, and the compiled one of tarpo.engine.static_decode with CUDA graphs) and a
  reference-style loop (full-vocabulary mixture, text re-decoded every step;
  benchmarks/reference_loop.py), batch 64, 512 new tokens, learned routing (b0 = [2.2, 0]);
- decode step time against the weight-bandwidth floor (weight bytes / measured device copy
  bandwidth);
- one training step (group 8, 1,024 completion tokens, LoRA r 32 on q/k/v/o, gradient
  checkpointing): time and peak memory of both paths.

Without ``--only`` every benchmark runs side by side in this one process. With ``--only`` one
benchmark of BENCHES runs and its result (with date, device and the machine's boot id) goes to
``--json``; ``--render`` turns a file of such results ({step: result}, benchmarks/gpu_check.sh
writes it) into the report, with ratios only between results of the same machine. The report
(Markdown) names the date, device and package versions; ``--tests-log`` appends the GPU tests' summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_loop import reference_generate  # noqa: E402

from tarpo.config import TarpoConfig  # noqa: E402
from tarpo.evaluation.results import package_versions  # noqa: E402
from tarpo.atomic_files import write_json_atomic, write_text_atomic  # noqa: E402
from tarpo.models.backends import make_backbone  # noqa: E402
from tarpo.models.loading import lora_config, resolve_backend  # noqa: E402
from tarpo.training.loss_inputs import rollout_loss  # noqa: E402
from tarpo.training.objective import LossSettings  # noqa: E402
from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate  # noqa: E402
from tarpo.engine.soft_input import TOP_K_MIXTURE  # noqa: E402
from tarpo.engine.router import Router  # noqa: E402
from tarpo.training.scoring import ScoreSettings, score_rollout  # noqa: E402
from tarpo.engine.tagging import token_text_fn  # noqa: E402
from tarpo.models.tiny import QWEN25_3B, QWEN25_15B, left_padded_prompts, random_model_dir, synthetic_rollout  # noqa: E402

VERSIONED = ("torch", "transformers", "trl", "peft", "unsloth", "unsloth_zoo", "tarpo")
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=512, max_position_embeddings=2048, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)


def free_memory():
    """Release the last benchmark's model before the next one is measured."""
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeats: int):
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(device) -> float:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 26)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    t = timed(lambda: b.copy_(a), 5)
    return 2 * n / t


def load(path: str, backend: str, device, lora: bool, config: TarpoConfig):
    """(policy model, tokenizer) on the given backend, LoRA r/alpha/targets from ``config``."""
    from peft import get_peft_model

    from tarpo.models.loading import load_base_model, load_tokenizer, unsloth_policy
    if backend == "unsloth":
        model = unsloth_policy(path, config, "bfloat16")
    else:
        model = load_base_model(path, "bfloat16" if device.type == "cuda" else "float32", device)
        if lora:
            model = get_peft_model(model, lora_config(config))
    return model, load_tokenizer(path)


SHAPES = {"1.5b": QWEN25_15B, "3b": QWEN25_3B}


def bench_rollout(path, backend, device, args, config, ours=True, reference=False, engine="eager"):
    """Rollout tokens/s of ``backend`` with ``engine`` (``ours``) and/or of the reference-style loop
    (``reference``). A compiled engine warms up (compiles) at the measured length; its compile time
    is the warm-up minus the median."""
    model, tok = load(path, backend, device, lora=True, config=config)
    model.eval()
    router = Router(model.config.hidden_size, bias=[2.2, 0.0]).to(device)
    # left-padded prompts of varying lengths (prompt_len down to prompt_len / 4): a padding mask at every step
    prompts, mask = left_padded_prompts(args.batch, args.prompt_len, model.config.vocab_size, tok.pad_token_id)
    prompts, mask = prompts.to(device), mask.to(device)
    token_text = token_text_fn(tok)
    spec = RolloutSpec(max_new_tokens=args.new_tokens, temperature=0.5, routing="learned", engine=engine)
    out = {"engine": engine, "prompt_lengths": [int(mask.sum(1).min()), int(mask.sum(1).max())]}

    def generate(n):
        s = RolloutSpec(max_new_tokens=n, temperature=0.5, routing="learned", engine=engine)
        policy = Policy(make_backbone(model), token_text, [tok.eos_token_id], tok.pad_token_id, router,
                        TOP_K_MIXTURE)
        return hybrid_generate(policy, prompts, mask, s)

    if ours:
        warm = timed(lambda: generate(spec.max_new_tokens if engine == "compiled" else 16), 1)  # kernels, compile
        torch.manual_seed(0)
        r = None

        def run():
            nonlocal r
            r = generate(spec.max_new_tokens)
        t = timed(run, args.repeats)
        out["tokens_per_s"] = int(r.units.sum()) / t
        out["step_ms"] = 1000 * t / r.token_ids.shape[1]
        out["soft_ratio"] = float(r.is_soft.sum() / r.units.sum())
        if engine == "compiled":
            out["compile_s"] = warm - t
    if reference:
        reference_generate(model, router, tok, prompts, mask, 16)
        t_ref = timed(lambda: reference_generate(model, router, tok, prompts, mask, args.new_tokens), 1)
        out["reference_tokens_per_s"] = args.batch * args.new_tokens / t_ref
    out["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    return out


def bench_train_step(path, backend, device, args, config):
    model, _ = load(path, backend, device, lora=True, config=config)
    model.train()
    if backend == "hf":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    router = Router(model.config.hidden_size, bias=[2.2, 0.0]).to(device)
    ref = router.frozen_copy()
    rollout = synthetic_rollout(model.config.vocab_size, args.group, args.prompt_len, args.train_completion, 30,
                                device)
    adv = torch.randn(args.group, generator=torch.Generator().manual_seed(1)).to(device)
    losses = []

    def step():
        scores = score_rollout(make_backbone(model), router, ref, rollout,
                               ScoreSettings(temperature=0.5, chunk_size=1024, use_router=True, with_reference=True),
                               TOP_K_MIXTURE)
        loss, _ = rollout_loss(LossSettings(lambda_act=0.1, beta=0.005, alpha=1.0), scores, rollout, adv)
        loss.backward()
        losses.append(loss.item())
        model.zero_grad(set_to_none=True)
        router.zero_grad(set_to_none=True)

    step()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t = timed(step, args.repeats)
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else float("nan")
    return {"step_s": t, "peak_bytes": peak, "first_loss": losses[0]}


BENCHES = ("rollout-hf", "rollout-compiled", "reference", "train-hf", "rollout-unsloth", "rollout-compiled-unsloth",
           "train-unsloth", "bandwidth")  # hf first:
# importing unsloth changes transformers process-wide, so in one process the hf path must run before it.


def provenance(device) -> dict:
    """When and where a result was measured: ratios are side by side only within one boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        boot_id = None
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "boot_id": boot_id,
            "versions": package_versions(VERSIONED)}


def run_one(name: str, args, path: str | None = None) -> dict:
    """One benchmark of BENCHES on the random-init model at ``path`` (made here when None)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    res = {**provenance(device), "sizes": {k: getattr(args, k) for k in (
        "tiny", "shape", "batch", "new_tokens", "prompt_len", "group", "train_completion", "repeats")}}
    if name == "bandwidth":
        res["bandwidth"] = copy_bandwidth(device)
        return res
    backend = "unsloth" if name.endswith("unsloth") else "hf"
    if backend == "unsloth" and resolve_backend("auto") != "unsloth":
        res["skipped"] = "needs CUDA and Unsloth (scripts/install_gpu.sh)"
        return res
    config = TarpoConfig(output_dir=tempfile.mkdtemp(), lora_r=32, lora_alpha=64, bf16=device.type == "cuda",
                         max_prompt_length=args.prompt_len, max_completion_length=max(args.new_tokens,
                                                                                      args.train_completion),
                         gradient_checkpointing=True, report_to="none")
    with tempfile.TemporaryDirectory() as root:
        path = path or random_model_dir(root, TINY if args.tiny else SHAPES[args.shape])
        if name.startswith("train"):
            res.update(bench_train_step(path, backend, device, args, config))
        else:
            res.update(bench_rollout(path, backend, device, args, config, ours=name != "reference",
                                     reference=name == "reference",
                                     engine="compiled" if "compiled" in name else "eager"))
    return res


def _machine(result: dict):
    return result.get("boot_id") or result.get("device")


def _same_machine(*results) -> bool:
    return all(r and "error" not in r and "skipped" not in r for r in results) and \
        len({_machine(r) for r in results}) == 1


def render(results: dict) -> str:
    """The Markdown report of a {step: result} file; steps not run yet are named as such."""
    steps = {k: v for k, v in results.items() if isinstance(v, dict)}
    devices = sorted({str(v["device"]) for v in steps.values() if v.get("device")})
    machines = {_machine(v) for v in steps.values() if _machine(v)}
    dates = sorted(v["date"] for v in steps.values() if v.get("date"))
    lines = [f"# GPU check: {', '.join(devices) or 'no results'}{', ' + dates[0][:10] if dates else ''}", ""]
    if len(machines) > 1:
        lines += [f"Results from {len(machines)} machines (boot ids): ratios are given only between results of "
                  "one machine.", ""]
    inst = steps.get("install")
    if inst:
        lines += ["## Install", "", f"{inst.get('gpu') or 'no GPU'}; Python {inst.get('python')}, torch "
                  f"{inst.get('torch')} (CUDA {inst.get('cuda')}); {inst.get('date')}.", "",
                  "Packages: " + ", ".join(f"{k} {v}" for k, v in inst.get("versions", {}).items() if v), ""]
        if inst.get("pip_check"):
            lines += ["`pip check` on the kit's packages:", "", "```", *inst["pip_check"], "```", ""]
    tests = {k: v for k, v in steps.items() if k.startswith("test_")}
    if tests:
        lines += ["## Tests (each file in its own process)", "", "| file | exit | seconds | summary |",
                  "|---|---|---|---|"]
        lines += [f"| {k} | {v.get('rc')} | {v.get('seconds', '')} | {v.get('summary', '')} |"
                  for k, v in tests.items()]
        for k, v in tests.items():
            if v.get("rc") != 0 and v.get("tail"):
                lines += ["", f"{k}, end of its log:", "", "```", *v["tail"], "```"]
        lines.append("")

    def cell(name):  # why a benchmark has no numbers
        r = steps.get(name)
        return "not run" if r is None else r.get("error") or r.get("skipped")

    bw, ref = steps.get("bandwidth"), steps.get("reference")
    bench = next((v for k, v in steps.items() if k in BENCHES and "sizes" in v), None)
    sz = bench["sizes"] if bench else {}
    if bench:
        shape = {"1.5b": "Qwen2.5-1.5B", "3b": "Qwen2.5-3B"}[sz.get("shape", "1.5b")]
        lines += [f"Benchmarks: random-init {'tiny' if sz['tiny'] else shape} configuration, "
                  f"{'float32' if bench['device'] == 'cpu' else 'bf16'}.", ""]
    pad = next((f", left-padded prompts of {r['prompt_lengths'][0]}..{r['prompt_lengths'][1]} tokens"
                for r in (steps.get(n) for n in ("rollout-hf", "rollout-compiled", "rollout-unsloth",
                                                 "rollout-compiled-unsloth"))
                if isinstance(r, dict) and "prompt_lengths" in r), "")
    lines += [f"## Rollout (batch {sz['batch']}, {sz['new_tokens']} new tokens{pad}, learned routing b0 = [2.2, 0])"
              if sz else "## Rollout", "",
              "| path | tokens/s | step ms | step / floor | soft ratio | compile s |", "|---|---|---|---|---|---|"]
    for name in ("rollout-hf", "rollout-compiled", "rollout-unsloth", "rollout-compiled-unsloth"):
        r = steps.get(name)
        if cell(name):
            lines.append(f"| {name} | {cell(name)} | | | | |")
            continue
        floor = (f"{r['step_ms'] / (1000 * r['weight_bytes'] / bw['bandwidth']):.1f}" if _same_machine(r, bw)
                 else "")
        compile_s = f"{r['compile_s']:.0f}" if "compile_s" in r else ""
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {r['step_ms']:.2f} | {floor} "
                     f"| {r['soft_ratio']:.3f} | {compile_s} |")
    ref_cell = cell("reference") or f"{ref['reference_tokens_per_s']:.0f}"
    lines.append(f"| reference-style loop | {ref_cell} | | | | |")
    if bw and not cell("bandwidth"):
        weights = next((steps[n]["weight_bytes"]
                        for n in ("rollout-hf", "rollout-compiled", "rollout-unsloth", "rollout-compiled-unsloth")
                        if not cell(n) and _same_machine(steps[n], bw)), None)
        lines += ["", f"Copy bandwidth {bw['bandwidth'] / 1e9:.0f} GB/s" + (
            f"; {weights / 2**30:.2f} GiB of weights, so a decode step's weight-bandwidth floor is "
            f"{1000 * weights / bw['bandwidth']:.2f} ms." if weights else ".")]
    elif cell("bandwidth"):
        lines += ["", f"Copy bandwidth: {cell('bandwidth')}."]
    lines += ["", f"## Training step (group {sz['group']}, {sz['train_completion']} completion tokens, LoRA r 32)"
              if sz else "## Training step", "", "| path | step s | peak memory GiB | loss |", "|---|---|---|---|"]
    for name in ("train-hf", "train-unsloth"):
        r = steps.get(name)
        lines.append(f"| {name} | {cell(name)} | | |" if cell(name) else
                     f"| {name} | {r['step_s']:.3f} | {r['peak_bytes'] / 2**30:.2f} | {r['first_loss']:.6f} |")
    rh, ru, th, tu = (steps.get(n) for n in ("rollout-hf", "rollout-unsloth", "train-hf", "train-unsloth"))
    ratios = {}
    if _same_machine(rh, ref):
        ratios["hf rollout / reference-style loop (tokens/s)"] = rh["tokens_per_s"] / ref["reference_tokens_per_s"]
    if _same_machine(rh, ru):
        ratios["unsloth / hf rollout (tokens/s)"] = ru["tokens_per_s"] / rh["tokens_per_s"]
    rc = steps.get("rollout-compiled")
    if _same_machine(rh, rc):
        ratios["compiled / eager hf rollout (tokens/s)"] = rc["tokens_per_s"] / rh["tokens_per_s"]
    if _same_machine(rc, ru):
        ratios["compiled / unsloth rollout (tokens/s)"] = rc["tokens_per_s"] / ru["tokens_per_s"]
    if _same_machine(th, tu):
        ratios["hf / unsloth training step time"] = th["step_s"] / tu["step_s"]
        ratios["unsloth / hf training peak memory"] = tu["peak_bytes"] / th["peak_bytes"]
    lines += ["", "## Ratios (only between results of the same machine)", ""]
    lines += [f"- {k}: {v:.3f}" for k, v in ratios.items()] or ["- none yet"]
    if _same_machine(rh, ru) and _same_machine(th, tu):  # each pair side by side
        ok = ru["tokens_per_s"] >= rh["tokens_per_s"] and tu["step_s"] <= th["step_s"] and \
            tu["peak_bytes"] <= th["peak_bytes"]
        lines += ["", f"Unsloth at least as fast on rollout and training step, no more peak memory: "
                  f"**{'yes' if ok else 'no'}**"]
    stepwise = ("install", "test_patches.py", "test_hooks.py", "test_gpu.py") if "install" in steps else ()
    missing = [k for k in (*stepwise, *BENCHES) if k not in steps]
    if missing:
        lines += ["", "Not run yet: " + ", ".join(missing) + "."]
    if "tests-log" in steps:
        lines += ["", "## GPU tests (tests/test_gpu.py)", "", "```", *steps["tests-log"]["tail"], "```"]
    lines += ["", "Raw numbers:", "", "```json", json.dumps(results, indent=1, default=str), "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", help="the Markdown report to write (all-in-one run, or --render)")
    ap.add_argument("--tests-log")
    ap.add_argument("--only", choices=BENCHES, help="run this one benchmark and write its result to --json")
    ap.add_argument("--json", help="where --only writes its result")
    ap.add_argument("--render", metavar="RESULTS", help="render the {step: result} JSON file RESULTS to --report")
    ap.add_argument("--tiny", action="store_true", help="tiny model, small sizes (a CPU smoke run)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.5b", help="the random model's configuration")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--train-completion", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.tiny:
        args.batch, args.new_tokens, args.prompt_len, args.train_completion, args.repeats = 4, 16, 8, 32, 1
    if args.only:
        if not args.json:
            ap.error("--only needs --json")
        res = run_one(args.only, args)
        write_json_atomic(args.json, res)
        if "skipped" in res:
            print(f"gpu_bench: {args.only} skipped: {res['skipped']}", file=sys.stderr)
        return 1 if "skipped" in res and torch.cuda.is_available() else 0  # on a GPU, a skip is a failure
    if not args.report:
        ap.error("--report is needed (or --only with --json)")
    if args.render:
        with open(args.render) as f:
            results = json.load(f)
    else:
        results = {}
        with tempfile.TemporaryDirectory() as root:
            path = random_model_dir(root, TINY if args.tiny else SHAPES[args.shape])
            for name in BENCHES:
                results[name] = run_one(name, args, path)
                free_memory()
        if args.tests_log and os.path.exists(args.tests_log):
            results["tests-log"] = {"tail": open(args.tests_log).read().strip().splitlines()[-15:]}
    text = render(results)
    write_text_atomic(args.report, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
