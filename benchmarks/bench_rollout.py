"""Rollout throughput on CPU: both hybrid engines against ``model.generate``, side by side.

A random ~25M-parameter Qwen2 (vocabulary 32,768, 4 K/V heads for 8 query heads), batch 16,
left-padded prompts of varying lengths (64 down to 16 tokens: every decode step attends with a
padding mask), 256 new tokens, sampling at T = 0.5 with no top-k/top-p. EOS is disabled everywhere so every
row decodes all 256 steps and every method does the same number of model steps. Methods:

- ``generate``: ``model.generate`` (dynamic cache), the stock reference;
- ``generate_static``: ``generate`` with a static cache and its forward compiled, the fastest
  stock baseline;
- ``eager_hard`` / ``eager_learned``: the eager engine (routing hard / learned, ~10% soft),
  sampling with ``torch.multinomial`` as ``generate`` does (what it runs by default);
- ``eager_learned_noise``: the eager engine given pre-drawn noise (``noise_seed``: Gumbel-max
  sampling, as the compiled engine): the same arithmetic, so the ratio to it is what the
  compiled step itself buys;
- ``compiled_hard`` / ``compiled_learned``: the compiled engine (tarpo.engine.static_decode).

Each method runs once to warm up (compiling, for the compiled ones), then ``--repeats`` times,
interleaved; the median counts. Compile time is the warm-up call minus the median, measured
with torch.compile's on-disk caches off (``--warm-caches`` keeps them: the time a second run
pays).

    python benchmarks/bench_rollout.py
    # last line: hard/generate=R1 learned/generate=R2 compiled/eager=R3 compiled/generate=R4 ...

``compiled/eager`` compares the learned-routing engines given the same noise (eager_learned_noise),
``compiled/eager_multinomial`` with the eager engine as it runs by default, ``compiled/generate``
the compiled learned engine with plain ``generate``, ``compiled/generate_static`` with the static one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if "--warm-caches" not in sys.argv:
    os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

import torch  # noqa: E402
from transformers import CompileConfig, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from tarpo.engine.backbone import Backbone  # noqa: E402
from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate  # noqa: E402
from tarpo.engine.soft_input import TOP_K_MIXTURE  # noqa: E402
from tarpo.engine.router import Router  # noqa: E402
from tarpo.models.tiny import left_padded_prompts  # noqa: E402


def build_model(vocab: int, seed: int = 0):
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=256, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=4, intermediate_size=1024, max_position_embeddings=2048,
                      tie_word_embeddings=False, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm-caches", action="store_true", help="keep torch.compile's on-disk caches")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    vocab = 32768
    model = build_model(vocab)
    n_params = sum(p.numel() for p in model.parameters())
    # left-padded prompts of varying lengths (prompt_len down to prompt_len / 4), as a real batch
    ids, mask = left_padded_prompts(args.batch, args.prompt_len, vocab, pad_token_id=0, low=2)
    lengths = mask.sum(1)
    backbone = Backbone(model)
    router = Router(model.config.hidden_size, bias=[2.2, 0.0])  # rho(soft) ~ 10%
    token_text = lambda tok: "#" if tok == 3 else "a"  # noqa: E731  (a tag is reachable but improbable)
    static = CompileConfig(fullgraph=True, dynamic=False)
    static._compile_all_devices = True  # generate compiles only on accelerators unless told

    def run_generate(**extra):
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.5, top_k=0,
                             top_p=1.0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                             pad_token_id=0, eos_token_id=None, **extra)
        return (out.shape[1] - ids.shape[1]) * args.batch, None

    def run_engine(routing, engine, noise_seed=None):
        spec = RolloutSpec(max_new_tokens=args.new_tokens, temperature=0.5, top_k=0, top_p=1.0, routing=routing,
                           soft_top_k=30, answer_tag="####", engine=engine)
        r = hybrid_generate(Policy(backbone, token_text, [], 0, router, TOP_K_MIXTURE), ids, mask, spec,
                            noise_seed=noise_seed)
        return int(r.units.sum()), float(r.is_soft.sum() / r.units.sum())

    methods = {
        "generate": run_generate,
        "generate_static": lambda: run_generate(cache_implementation="static", compile_config=static),
        "eager_hard": lambda: run_engine("hard", "eager"),
        "eager_learned": lambda: run_engine("learned", "eager"),
        "eager_learned_noise": lambda: run_engine("learned", "eager", noise_seed=0),
        "compiled_hard": lambda: run_engine("hard", "compiled"),
        "compiled_learned": lambda: run_engine("learned", "compiled"),
    }
    warmup = {}
    with torch.no_grad():
        for name, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            warmup[name] = time.perf_counter() - t0
        times = {name: [] for name in methods}
        tokens, soft = {}, {}
        for _ in range(args.repeats):
            for name, fn in methods.items():
                t0 = time.perf_counter()
                tokens[name], soft[name] = fn()
                times[name].append(time.perf_counter() - t0)

    print(f"model: Qwen2 random init, {n_params / 1e6:.1f}M parameters, vocab {vocab}; batch {args.batch}, "
          f"prompt {args.prompt_len} (left-padded, {int(lengths.min())}..{int(lengths.max())} tokens), "
          f"{args.new_tokens} new tokens, {args.threads} threads, median of "
          f"{args.repeats}; torch {torch.__version__}, compile caches {'warm' if args.warm_caches else 'off'}")
    tps = {}
    for name in methods:
        median = statistics.median(times[name])
        tps[name] = tokens[name] / median
        extra = f", soft ratio {soft[name]:.3f}" if soft[name] is not None else ""
        if name in ("generate_static", "compiled_hard", "compiled_learned"):
            extra += f", compile {warmup[name] - median:.1f} s"
        print(f"{name:>19}: {tps[name]:8.1f} tokens/s, {1e3 * median / args.new_tokens:6.2f} ms/step "
              f"(times {', '.join(f'{t:.2f}' for t in times[name])} s{extra})")
    print(f"hard/generate={tps['eager_hard'] / tps['generate']:.3f} "
          f"learned/generate={tps['eager_learned'] / tps['generate']:.3f} "
          f"compiled/eager={tps['compiled_learned'] / tps['eager_learned_noise']:.3f} "
          f"compiled/eager_multinomial={tps['compiled_learned'] / tps['eager_learned']:.3f} "
          f"compiled/generate={tps['compiled_learned'] / tps['generate']:.3f} "
          f"compiled/generate_static={tps['compiled_learned'] / tps['generate_static']:.3f}")


if __name__ == "__main__":
    main()
