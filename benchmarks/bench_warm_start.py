"""The demo's warm-start step: whole rows against the shared system turn run once
(:func:`tarpo.runs.demo.shared_prefix_loss`), side by side, interleaved.

The demo's tokenizer and model (``tarpo.runs.demo.MODEL``), batches of 32 noisy demonstrations as
the warm start draws them; each round times one forward + backward of each kind on a fresh
batch, in alternating order, after ``--warmup`` untimed rounds. The last line is the ratio.

    python benchmarks/bench_warm_start.py [--rounds 40] [--threads 2]
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from tarpo.runs.demo import (common_prefix, demo_tokenizer_and_model, demonstration_batch, prompt_ids,
                             shared_prefix_loss)
from tarpo.tasks.synthetic import make_split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: one per core, as the demo)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads or torch.get_num_threads())
    train = make_split("train")
    tokenizer, model = demo_tokenizer_and_model(train, seed=0)
    prompts = prompt_ids(tokenizer, train)
    shared = common_prefix(prompts)
    prefix, rest = torch.tensor(shared), [p[len(shared):] for p in prompts]
    rng = random.Random(0)
    seconds = {"full": 0.0, "shared": 0.0}
    for r in range(args.warmup + args.rounds):
        for kind in (("full", "shared") if r % 2 else ("shared", "full")):
            picks = rng.sample(range(len(train)), args.batch)
            ids, mask, labels = demonstration_batch(tokenizer, prompts if kind == "full" else rest, train, picks,
                                                    rng, 0.4)
            start = time.perf_counter()
            if kind == "full":
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            else:
                loss = shared_prefix_loss(model, prefix, ids, mask, labels)
            loss.backward()
            model.zero_grad()
            if r >= args.warmup:
                seconds[kind] += time.perf_counter() - start
    print(f"prefix {len(shared)} tokens of prompts of {sum(map(len, prompts)) / len(prompts):.1f}; "
          f"batch {args.batch}, {torch.get_num_threads()} threads, {args.rounds} rounds")
    print(" ".join(f"{k}={v / args.rounds * 1000:.1f}ms" for k, v in seconds.items()))
    print(f"shared/full={seconds['shared'] / seconds['full']:.3f}")


if __name__ == "__main__":
    main()
