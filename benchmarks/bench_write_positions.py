"""The compiled decode step's time at several write positions of one cache (docs/rollout-engines.md).

A batch of prompts of ``p`` tokens is prefilled into a cache of ``--cache`` positions (2,048: the MATH preset's
1,024 + 1,024), and the compiled engine (:mod:`tarpo.engine.static_decode`) decodes ``--steps`` tokens from
write position ``p``; every step is timed (CUDA events on a GPU, the host clock on the CPU) and the median of
the steps after the first two (compile or warm-up, capture) is the step time at ``p``. Every rollout runs under
the trainer's autocast (:func:`tarpo.engine.precision.mixed_precision`: with bf16 weights the LoRA products run in
bf16 too, as in training; before 2026-11-27 this benchmark ran them in fp32, so its earlier step times, 8.4 ms on
the H100 and 5.36 ms on the H200, time another graph). Each position runs
with the engine's rule (``written``: attention over the written slots, rounded up to
:data:`tarpo.engine.step_replay.ATTENTION_BUCKET`) and over the whole cache (``full``, the engine before that
rule); positions and modes are interleaved over ``--rounds`` rounds, all in one process, on one compiled graph
(same batch, steps, cache). ``kv_gb_per_step``: the K/V bytes a step reads at the middle of its steps.

The first rollout's total less the same position's later median is the cold compile (and capture) time.

    python benchmarks/bench_write_positions.py --model DIR [--positions 64,512,1900] [--json out.json]
    python benchmarks/bench_write_positions.py --shape smollm2-135m --batch 8      # a random model, in memory

``--model`` loads a saved model on the launchers' default backend (Unsloth on CUDA where installed; LoRA r 32
on q/k/v/o); ``--shape`` builds a random one of that shape (:data:`SHAPES`) on the CPU's transformers path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tarpo.architectures import ARCHITECTURES  # noqa: E402
from tarpo.config import TarpoConfig  # noqa: E402
from tarpo.engine import functional_decoder, static_decode  # noqa: E402
try:  # the step's runner and attention spans: static_decode's in a tree before tarpo/engine/step_replay.py
    from tarpo.engine import step_replay  # noqa: E402
except ImportError:
    step_replay = static_decode
from tarpo.engine.precision import mixed_precision  # noqa: E402
from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate  # noqa: E402
from tarpo.engine.soft_input import TOP_K_MIXTURE  # noqa: E402
from tarpo.engine.router import Router  # noqa: E402
from tarpo.engine.tagging import token_text_fn  # noqa: E402
from tarpo.models.backends import make_backbone  # noqa: E402
from tarpo.models.loading import load_tokenizer, lora_config, resolve_backend, training_policy  # noqa: E402
from tarpo.models.tiny import left_padded_prompts, random_model_dir  # noqa: E402

SMOLLM2_135M = dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                    max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0)
SHAPES = {"smollm2-135m": SMOLLM2_135M, "qwen2.5-3b": ARCHITECTURES["qwen2.5-3b"],
          "tiny": dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096,
                       rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)}


def load_lora_model(model_dir: str, cuda: bool, cache: int, steps: int, targets: str | None = None,
                    bf16: bool | None = None):
    """The model as a launcher trains it (default backend, LoRA r 32 on q/k/v/o or ``targets``), in eval mode;
    bf16 weights on CUDA (or with ``bf16``), fp32 LoRA. The LoRA's B is random (a trained adapter's, not PEFT's
    zeros), so that merging it changes the weights."""
    backend = resolve_backend("auto")
    bf16 = cuda if bf16 is None else bf16
    extra = {"lora_target_modules": targets.split(",")} if targets else {}
    config = TarpoConfig(output_dir=tempfile.mkdtemp(prefix="bench-positions-"), lora_r=32, lora_alpha=64,
                         bf16=bf16, use_cpu=bf16 and not cuda, report_to="none", max_prompt_length=cache - steps,
                         max_completion_length=steps, **extra)
    model = training_policy(model_dir, config, backend, "bfloat16" if bf16 else "float32")
    if backend == "hf":
        from peft import get_peft_model
        model = get_peft_model(model.to("cuda" if cuda else "cpu"), lora_config(config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return model.eval(), backend


class StepClock:
    """Wraps :func:`tarpo.engine.step_replay.step_runner`: the time of every step call of a rollout."""

    def __init__(self, cuda: bool):
        self.cuda, self.calls, self.runner = cuda, [], step_replay.step_runner

    def __enter__(self):
        def timed_runner(call, *where):  # (mask, device); (device) in an engine that attends over the whole cache
            run, self.calls = self.runner(call, *where), []

            def step(*span):
                if self.cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    run(*span)
                    end.record()
                    self.calls.append((start, end))
                else:
                    t0 = time.perf_counter()
                    run(*span)
                    self.calls.append(time.perf_counter() - t0)
            return step
        step_replay.step_runner = timed_runner
        return self

    def __exit__(self, *exc):
        step_replay.step_runner = self.runner

    def step_ms(self) -> float:
        """Median milliseconds of the steps after the first two."""
        if self.cuda:
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in self.calls[2:]]
        else:
            times = [1000 * t for t in self.calls[2:]]
        return statistics.median(times)


def measure(model, tok, args, cuda: bool) -> dict:
    device = torch.device("cuda" if cuda else "cpu")
    router = Router(model.config.hidden_size, bias=[2.2, 0.0]).to(device)
    policy = Policy(make_backbone(model), token_text_fn(tok), [tok.eos_token_id], tok.pad_token_id, router,
                    TOP_K_MIXTURE)
    spec = RolloutSpec(max_new_tokens=args.steps, temperature=0.5, routing="learned", engine="compiled",
                       max_prompt_length=args.cache - args.steps, batch_size=args.batch)
    prompts = {p: [x.to(device) for x in left_padded_prompts(args.batch, p, len(tok), tok.pad_token_id, shortest=p)]
               for p in args.positions}
    res = {"positions": {}, "cache": functional_decoder.cache_length(0, args.steps, spec.max_prompt_length)}

    def rollout(p, mode="written", merge=None):
        if bucket is not None:  # None: an engine without the written-slot attention: it attends over the whole cache
            step_replay.ATTENTION_BUCKET = bucket if mode == "written" else 10 ** 9  # "full": all slots
        run_spec = spec if merge is None else replace(spec, decode_merge=merge)  # a tree before decode_merge: no merge
        with StepClock(cuda) as clock, mixed_precision(policy.backbone):  # the trainer's autocast: bf16 LoRA
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            hybrid_generate(policy, *prompts[p], run_spec)
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - t0, clock.step_ms()

    bucket = getattr(step_replay, "ATTENTION_BUCKET", None)
    first_total, _ = rollout(args.positions[0], args.modes[0], args.merges[0])
    runs = [(p, mode, merge) for p in args.positions for mode in args.modes for merge in args.merges]
    totals, steps = {run: [] for run in runs}, {run: [] for run in runs}
    for r in range(args.rounds):
        for run in (runs if r % 2 == 0 else runs[::-1]):
            total, step = rollout(*run)
            totals[run].append(total)
            steps[run].append(step)
    if bucket is not None:
        step_replay.ATTENTION_BUCKET = bucket
    kv_token = 2 * model.config.num_hidden_layers * model.config.num_key_value_heads * (
        model.config.hidden_size // model.config.num_attention_heads) * (2 if cuda else 4)
    for p, mode, merge in runs:
        span = res["cache"]
        if mode == "written" and hasattr(step_replay, "attention_span"):
            span = step_replay.attention_span(p + args.steps // 2, res["cache"])
        key = mode if len(args.merges) == 1 else f"{mode}/{merge}"
        run = p, mode, merge
        res["positions"].setdefault(str(p), {})[key] = {
            "step_ms": statistics.median(steps[run]), "rollout_s": statistics.median(totals[run]),
            "kv_gb_per_step": args.batch * span * kv_token / 1e9}
    res["first_rollout_s"] = first_total
    first = args.modes[0] if len(args.merges) == 1 else f"{args.modes[0]}/{args.merges[0]}"
    res["compile_s"] = first_total - res["positions"][str(args.positions[0])][first]["rollout_s"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a saved model folder (else --shape)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--layers", type=int, help="--shape with this many decoder layers")
    ap.add_argument("--lora-targets", default=None, help="comma-separated LoRA targets (default: the launchers')")
    ap.add_argument("--regional", choices=["default", "on", "off"], default="default",
                    help="each decoder layer a nested compile region (static_decode.REGIONAL_COMPILE) on this device, "
                         "or not; default: the engine's setting (on for the CPU, off for CUDA)")
    ap.add_argument("--log-code", action="store_true",
                    help="log inductor's generated code (TORCH_LOGS=output_code; set after loading, as importing "
                         "Unsloth sets every torch log to CRITICAL): benchmarks/count_kernels.py counts it")
    ap.add_argument("--positions", default="64,512,1900")
    ap.add_argument("--cache", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="written,full",
                    help="written: attention over the written slots (the engine's rule); full: over the whole cache")
    ap.add_argument("--bf16", action="store_true", help="bf16 weights on the CPU too (as on a GPU; fp32 LoRA)")
    ap.add_argument("--merges", default="default",
                    help="decode weights (TarpoConfig.decode_merge), comma-separated and interleaved: all | attention "
                         "| none; default: the RolloutSpec's (a tree before decode_merge has no such setting)")
    ap.add_argument("--json", help="write the results here (merged under the key --key)")
    ap.add_argument("--key", default="write_positions", help="the results' key in --json")
    args = ap.parse_args()
    args.positions = [int(p) for p in args.positions.split(",")]
    args.modes = args.modes.split(",")
    args.merges = [None if m == "default" else m for m in args.merges.split(",")]
    cuda = torch.cuda.is_available()
    if args.regional != "default":
        static_decode.REGIONAL_COMPILE["cuda" if cuda else "cpu"] = args.regional == "on"
    t0 = time.perf_counter()
    if args.model:
        model_dir = args.model
    else:
        shape = {k: v for k, v in SHAPES[args.shape].items() if k != "model_type"}
        shape["num_hidden_layers"] = args.layers or shape["num_hidden_layers"]
        model_dir = random_model_dir(tempfile.mkdtemp(prefix="bench-positions-"), shape, torch.float32,
                                     arch=SHAPES[args.shape]["model_type"])
    model, backend = load_lora_model(model_dir, cuda, args.cache, args.steps, args.lora_targets, args.bf16 or None)
    load_s = time.perf_counter() - t0
    if args.log_code:
        import logging
        torch._logging.set_logs(output_code=True, all=logging.WARNING)
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu", "backend": backend, "batch": args.batch,
           "merges": args.merges,
           "regional": getattr(static_decode, "REGIONAL_COMPILE", {}).get("cuda" if cuda else "cpu", False),
           "steps": args.steps, "model": args.model or args.shape,
           "lora_targets": args.lora_targets or "launchers'", "layers": model.config.num_hidden_layers,
           "load_s": load_s, "torch": torch.__version__,
           "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR", "default")}
    res.update(measure(model, load_tokenizer(model_dir), args, cuda))
    print(json.dumps(res, indent=1))
    if args.json:
        from results_file import record
        record(args.json, args.key, res)


if __name__ == "__main__":
    main()
