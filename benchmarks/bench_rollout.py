"""Rollout throughput on CPU: the hybrid engine vs ``model.generate``, side by side.

A random ~25M-parameter Qwen2 (vocabulary 32,768), batch 16, 256 new tokens, sampling at
T = 0.5 with no top-k/top-p. EOS is disabled in all three so every row decodes all 256
steps and the three do the same number of model steps (the engine's compaction of
finished rows is not what this measures). Each method runs ``--repeats`` times,
interleaved; the median time counts.

    python benchmarks/bench_rollout.py            # last line: hard/generate=R1 learned/generate=R2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tarpo.backbone import Backbone
from tarpo.rollout import RolloutSpec, hybrid_generate
from tarpo.router import Router


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
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    vocab = 32768
    model = build_model(vocab)
    n_params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(2, vocab, (args.batch, args.prompt_len))
    mask = torch.ones_like(ids)
    mask[: args.batch // 2, : args.prompt_len // 4] = 0  # left padding in half the rows
    ids[mask == 0] = 0
    backbone = Backbone(model)
    router = Router(model.config.hidden_size, bias=[2.2, 0.0])  # rho(soft) ~ 10%
    piece = lambda tok: "#" if tok == 3 else "a"  # noqa: E731  (a tag is reachable but improbable)

    def run_generate():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.5, top_k=0,
                             top_p=1.0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                             pad_token_id=0, eos_token_id=None)
        return (out.shape[1] - ids.shape[1]) * args.batch, None

    def run_engine(routing):
        spec = RolloutSpec(max_new_tokens=args.new_tokens, temperature=0.5, top_k=0, top_p=1.0, routing=routing,
                           soft_top_k=30, answer_tag="####")
        r = hybrid_generate(backbone, router, ids, mask, spec, piece, eos_token_ids=[], pad_token_id=0)
        return int(r.units.sum()), float(r.is_soft.sum() / r.units.sum())

    methods = {"generate": run_generate, "hard": lambda: run_engine("hard"), "learned": lambda: run_engine("learned")}
    with torch.no_grad():
        for fn in methods.values():  # warm-up
            fn()
        times = {name: [] for name in methods}
        tokens, soft = {}, {}
        for _ in range(args.repeats):
            for name, fn in methods.items():
                t0 = time.perf_counter()
                tokens[name], soft[name] = fn()
                times[name].append(time.perf_counter() - t0)

    print(f"model: Qwen2 random init, {n_params / 1e6:.1f}M parameters, vocab {vocab}; batch {args.batch}, "
          f"prompt {args.prompt_len}, {args.new_tokens} new tokens, {args.threads} threads, "
          f"median of {args.repeats}")
    tps = {}
    for name in methods:
        tps[name] = tokens[name] / statistics.median(times[name])
        extra = f", soft ratio {soft[name]:.3f}" if soft[name] is not None else ""
        print(f"{name:>9}: {tps[name]:8.1f} tokens/s (times {', '.join(f'{t:.2f}' for t in times[name])} s{extra})")
    print(f"hard/generate={tps['hard'] / tps['generate']:.3f} learned/generate={tps['learned'] / tps['generate']:.3f}")


if __name__ == "__main__":
    main()
