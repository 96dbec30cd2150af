"""Rollouts of a model Unsloth loaded, on the CPU: Unsloth's decode (the eager engine) against the compiled
engine over the same model's tensors, side by side in one run, and the kernels each launches per decode step.

Unsloth's own Python code runs under the test harness (``tests/workers/unsloth_cpu.py``: device queries and
two Triton kernels stood in for), from ``.venv/unsloth-cpu`` (``bash scripts/setup_env.sh``). A random Qwen2
(d 256, 4 layers, 8 query and 2 K/V heads, vocabulary 32,768) with a LoRA adapter on q/k/v/o and a router
sending about half the steps soft; 16 left-padded prompts of 48 tokens, 64 new tokens, keyed noise, EOS
disabled, so both engines make the same steps and draw the same tokens (checked). Each engine runs once to
warm up (the compiled one compiles with inductor, caches off), then ``--repeats`` times, interleaved; medians.

Kernel launches per decode step: the operators the profiler records (aten operators without children, and
inductor's generated kernels, recorded with ``torch._inductor.config.cpp.enable_kernel_profile``), over a
rollout of T steps minus one of T/2 steps, per step. On a GPU each is a kernel launch of its own (a CUDA
graph replays the compiled step's as one): the figure that bounds a launch-bound GPU decode step.

    python benchmarks/bench_unsloth_rollout.py      # last line: compiled/eager=R launches_eager=N launches_compiled=M
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = os.path.join(ROOT, ".venv", "unsloth-cpu")
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ.update(UNSLOTH_ALLOW_CPU="1", HF_HUB_OFFLINE="1")
os.environ.setdefault("UNSLOTH_COMPILE_LOCATION", tempfile.mkdtemp(prefix="unsloth_cache."))  # not in the checkout
sys.path[:0] = [SITE, os.path.join(ROOT, "tests", "workers"), os.path.join(ROOT, "tests"), ROOT]

import torch  # noqa: E402

CONFIG = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=2, vocab_size=32768, max_position_embeddings=2048, rope_theta=1e6,
              rms_norm_eps=1e-6, tie_word_embeddings=False)


def rollout(backbone, router, ids, mask, engine, steps, tok):
    from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate
    from tarpo.engine.soft_input import TOP_K_MIXTURE
    spec = RolloutSpec(max_new_tokens=steps, temperature=0.5, routing="learned", engine=engine,
                       compact_finished_rows=False)
    policy = Policy(backbone, lambda i: "x", [], tok.pad_token_id, router, TOP_K_MIXTURE)
    return hybrid_generate(policy, ids, mask, spec, noise_seed=7)


def launches(run) -> int:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    events = prof.events()
    parents = {id(e.cpu_parent) for e in events if e.cpu_parent is not None}
    return sum(1 for e in events if id(e) not in parents and (e.name.startswith("aten::") or "cpp_fused" in e.name))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(SITE, "unsloth")):
        print(f"bench_unsloth_rollout: Unsloth for the CPU is not in {SITE} (bash scripts/setup_env.sh)",
              file=sys.stderr)
        return 2
    from checkout import use_checkout_patches
    use_checkout_patches()
    import tarpo.training.trainer  # noqa: F401  (TRL's own GRPOTrainer before Unsloth)
    import unsloth_cpu
    from backend_worker import prepare
    from tarpo.models.backends import UnslothBackbone, make_backbone
    from tarpo.models.tiny import left_padded_prompts
    torch._inductor.config.cpp.enable_kernel_profile = True

    root = tempfile.mkdtemp()
    base, adapter = prepare(root, CONFIG, torch.float32)
    model, router, tok = unsloth_cpu.load_trained(base, adapter, max_seq_length=256)
    model.eval()
    backbone = make_backbone(model)
    assert isinstance(backbone, UnslothBackbone)
    ids, mask = left_padded_prompts(16, 48, 400, tok.pad_token_id)
    print(f"bench_unsloth_rollout: Qwen2 d 256, 4 layers, V 32768, 16 x (48 + {args.steps}), "
          f"{torch.get_num_threads()} threads", flush=True)
    times, first = {"eager": [], "compiled": []}, {}
    for engine in times:  # warm-up: the compile
        t0 = time.perf_counter()
        first[engine] = rollout(backbone, router, ids, mask, engine, args.steps, tok)
        print(f"  warm-up {engine}: {time.perf_counter() - t0:.1f} s", flush=True)
    assert torch.equal(first["eager"].token_ids, first["compiled"].token_ids), "the engines drew different tokens"
    assert torch.equal(first["eager"].is_soft, first["compiled"].is_soft) and first["eager"].is_soft.any()
    for _ in range(args.repeats):
        for engine in times:
            t0 = time.perf_counter()
            rollout(backbone, router, ids, mask, engine, args.steps, tok)
            times[engine].append(time.perf_counter() - t0)
    med = {e: statistics.median(t) for e, t in times.items()}
    per_step = {}
    rollout(backbone, router, ids, mask, "compiled", args.steps // 2, tok)  # the half rollout's graph, compiled first
    for engine in times:
        full = launches(lambda: rollout(backbone, router, ids, mask, engine, args.steps, tok))
        half = launches(lambda: rollout(backbone, router, ids, mask, engine, args.steps // 2, tok))
        per_step[engine] = (full - half) / (args.steps - args.steps // 2)
    for engine in times:
        print(f"  {engine:9s} {med[engine] * 1000 / args.steps:7.2f} ms a step  "
              f"{per_step[engine]:7.1f} kernel launches "
              f"a decode step ({per_step[engine] / CONFIG['num_hidden_layers']:.1f} a layer)")
    print(f"compiled/eager={med['compiled'] / med['eager']:.3f} launches_eager={per_step['eager']:.0f} "
          f"launches_compiled={per_step['compiled']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
