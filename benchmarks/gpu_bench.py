"""GPU benchmarks of issue #7: the Unsloth path against the transformers path, one report.

    python benchmarks/gpu_bench.py --report docs/gpu/2026-11-22-H100.md [--tests-log gpu_tests.log]
    python benchmarks/gpu_bench.py --tiny --report /tmp/smoke.md      # a CPU smoke run of the code paths

On a random-init model with the Qwen2.5-1.5B configuration (bf16; no weights needed):

- rollout tokens/s of the Unsloth path (tarpo.patches), the transformers path and a
  reference-style loop (full-vocabulary mixture, text re-decoded every step;
  benchmarks/reference_loop.py), batch 64, 512 new tokens, learned routing (b0 = [2.2, 0]);
- decode step time against the weight-bandwidth floor (weight bytes / measured device copy
  bandwidth);
- one training step (group 8, 1,024 completion tokens, LoRA r 32 on q/k/v/o, gradient
  checkpointing): time and peak memory of both paths.

Every ratio is measured side by side in this one run. The report (Markdown) names the date,
device and package versions; ``--tests-log`` appends the GPU tests' summary.
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
from tarpo.eval import package_versions  # noqa: E402  (imports tarpo.trainer: TRL's class before unsloth)
from tarpo.hooks import make_backbone  # noqa: E402
from tarpo.modeling import lora_config, resolve_backend  # noqa: E402
from tarpo.objective import tarpo_loss  # noqa: E402
from tarpo.rollout import RolloutSpec, hybrid_generate  # noqa: E402
from tarpo.router import Router  # noqa: E402
from tarpo.scoring import score_rollout  # noqa: E402
from tarpo.tagging import token_piece_fn  # noqa: E402
from tarpo.tiny import QWEN25_15B, random_model_dir, synthetic_rollout  # noqa: E402

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

    from tarpo.modeling import load_base_model, load_tokenizer, unsloth_policy
    if backend == "unsloth":
        model = unsloth_policy(path, config, "bfloat16")
    else:
        model = load_base_model(path, "bfloat16" if device.type == "cuda" else "float32", device)
        if lora:
            model = get_peft_model(model, lora_config(config))
    return model, load_tokenizer(path)


def bench_rollout(path, backend, device, args, config):
    model, tok = load(path, backend, device, lora=True, config=config)
    model.eval()
    router = Router(model.config.hidden_size, bias=[2.2, 0.0]).to(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    prompts = torch.randint(10, model.config.vocab_size, (args.batch, args.prompt_len), generator=g).to(device)
    mask = torch.ones_like(prompts)
    piece = token_piece_fn(tok)
    spec = RolloutSpec(max_new_tokens=args.new_tokens, temperature=0.5, routing="learned")
    out = {}

    def ours(n):
        s = RolloutSpec(max_new_tokens=n, temperature=0.5, routing="learned")
        return hybrid_generate(make_backbone(model), router, prompts, mask, s, piece, [tok.eos_token_id],
                               tok.pad_token_id)

    ours(16)  # warm-up (kernels, autotuning)
    torch.manual_seed(0)
    r = None

    def run():
        nonlocal r
        r = ours(spec.max_new_tokens)
    t = timed(run, args.repeats)
    out["tokens_per_s"] = int(r.units.sum()) / t
    out["step_ms"] = 1000 * t / r.token_ids.shape[1]
    out["soft_ratio"] = float(r.is_soft.sum() / r.units.sum())
    if backend == "hf":
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
        scores = score_rollout(make_backbone(model), router, ref, rollout, temperature=0.5, chunk_size=1024,
                               use_router=True, with_reference=True)
        loss, _ = tarpo_loss(logp_tok=scores.logp_tok, logp_act=scores.logp_act, p_hard=scores.p_hard,
                             kl_tok=scores.kl_tok, kl_act=scores.kl_act, advantages=adv,
                             completion_mask=rollout.completion_mask, is_soft=rollout.is_soft,
                             decided=rollout.decided, lambda_act=0.1, beta=0.005, alpha=1.0)
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


def report(res: dict, args) -> str:
    v = res["versions"]
    lines = [f"# GPU check: {res['device']}, {res['date']}", "",
             "Packages: " + ", ".join(f"{k} {v[k]}" for k in v if v[k]), "",
             f"Model: random-init {'tiny' if args.tiny else 'Qwen2.5-1.5B'} configuration, bf16 "
             f"({res['weight_bytes'] / 2**30:.2f} GiB of weights). Copy bandwidth {res['bandwidth'] / 1e9:.0f} GB/s, "
             f"weight-bandwidth floor of a decode step {res['floor_ms']:.2f} ms.", "",
             f"## Rollout (batch {args.batch}, {args.new_tokens} new tokens, learned routing b0 = [2.2, 0])", "",
             "| path | tokens/s | step ms | step / floor | soft ratio |", "|---|---|---|---|---|"]
    for name, r in res["rollout"].items():
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {r['step_ms']:.2f} | {r['step_ms'] / res['floor_ms']:.1f} "
                     f"| {r['soft_ratio']:.3f} |")
    hf = res["rollout"]["hf"]
    lines.append(f"| reference-style loop | {hf['reference_tokens_per_s']:.0f} | | | |")
    lines += ["", f"## Training step (group {args.group}, {args.train_completion} completion tokens, LoRA r 32)", "",
              "| path | step s | peak memory GiB | loss |", "|---|---|---|---|"]
    for name, r in res["train"].items():
        lines.append(f"| {name} | {r['step_s']:.3f} | {r['peak_bytes'] / 2**30:.2f} | {r['first_loss']:.6f} |")
    lines += ["", "## Ratios (measured side by side in this run)", ""]
    for key, value in res["ratios"].items():
        lines.append(f"- {key}: {value:.3f}")
    if res.get("acceptance"):
        lines += ["", f"Unsloth at least as fast on rollout and training step, no more peak memory: "
                  f"**{res['acceptance']}**"]
    if args.tests_log and os.path.exists(args.tests_log):
        tail = open(args.tests_log).read().strip().splitlines()[-15:]
        lines += ["", "## GPU tests (tests/test_gpu.py)", "", "```", *tail, "```"]
    lines += ["", "Raw numbers:", "", "```json", json.dumps(res, indent=1, default=str), "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", required=True)
    ap.add_argument("--tests-log")
    ap.add_argument("--tiny", action="store_true", help="tiny model, small sizes (a CPU smoke run)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--train-completion", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.tiny:
        args.batch, args.new_tokens, args.prompt_len, args.train_completion, args.repeats = 4, 16, 8, 32, 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backends = ["hf"] + (["unsloth"] if resolve_backend("auto") == "unsloth" else [])
    config = TarpoConfig(output_dir=tempfile.mkdtemp(), lora_r=32, lora_alpha=64, bf16=device.type == "cuda",
                         max_prompt_length=args.prompt_len, max_completion_length=max(args.new_tokens,
                                                                                      args.train_completion),
                         gradient_checkpointing=True, report_to="none")
    with tempfile.TemporaryDirectory() as root:
        path = random_model_dir(root, TINY if args.tiny else QWEN25_15B)
        res = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "versions": package_versions(VERSIONED),
               "rollout": {}, "train": {}}
        for b in backends:
            res["rollout"][b] = bench_rollout(path, b, device, args, config)
            free_memory()
            res["train"][b] = bench_train_step(path, b, device, args, config)
            free_memory()
    res["weight_bytes"] = res["rollout"]["hf"]["weight_bytes"]
    res["bandwidth"] = copy_bandwidth(device)
    res["floor_ms"] = 1000 * res["weight_bytes"] / res["bandwidth"]
    hf = res["rollout"]["hf"]
    res["ratios"] = {"hf rollout / reference-style loop (tokens/s)": hf["tokens_per_s"] / hf["reference_tokens_per_s"]}
    if "unsloth" in backends:
        un, ut, ht = res["rollout"]["unsloth"], res["train"]["unsloth"], res["train"]["hf"]
        res["ratios"].update({
            "unsloth / hf rollout (tokens/s)": un["tokens_per_s"] / hf["tokens_per_s"],
            "hf / unsloth training step time": ht["step_s"] / ut["step_s"],
            "unsloth / hf training peak memory": ut["peak_bytes"] / ht["peak_bytes"],
        })
        ok = (un["tokens_per_s"] >= hf["tokens_per_s"] and ut["step_s"] <= ht["step_s"]
              and ut["peak_bytes"] <= ht["peak_bytes"])
        res["acceptance"] = "yes" if ok else "no"
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    text = report(res, args)
    with open(args.report, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
