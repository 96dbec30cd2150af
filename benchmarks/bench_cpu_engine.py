"""``tarpo eval`` of a deep model on the CPU: the default engine (``--engine auto``) against
``--engine eager``, side by side, interleaved (a newcomer's laptop run, issue: a 30-layer model's
compile cost more than the whole evaluation).

A random Llama of 30 layers (a 135M-style depth at a small width) and the char tokenizer are
saved to a temporary folder; both engines evaluate the same GSM8K questions (a local GSM8K folder
given as ``--data``, else synthetic questions). Cold compile caches: the script points
``TORCHINDUCTOR_CACHE_DIR`` at a new temporary folder. The last line is the ratio.

    python benchmarks/bench_cpu_engine.py [--data ../shared/data/gsm8k] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-inductor-")

from tarpo.cli import main as cli  # noqa: E402
from tarpo.models.tiny import char_tokenizer, tiny_causal_lm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="a local GSM8K folder (else synthetic questions)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--shape", choices=["narrow", "smollm2-135m"], default="narrow",
                    help="narrow: width 128, 4/2 heads; smollm2-135m: width 576, 9/3 heads, MLP 1,536, 49,152 ids")
    ap.add_argument("--engines", default="auto,eager", help="the engines compared, e.g. compiled,eager,auto")
    ap.add_argument("--max-new-tokens", default="32")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-cpu-engine-")
    tok = char_tokenizer()
    shape = dict(hidden_size=128, heads=4, kv_heads=2)
    if args.shape == "smollm2-135m":
        shape = dict(hidden_size=576, heads=9, kv_heads=3, intermediate_size=1536, vocab_size=49152)
    model = tiny_causal_lm(tok, "llama", layers=args.layers, **shape)
    model.save_pretrained(os.path.join(root, "model"))
    tok.save_pretrained(os.path.join(root, "model"))
    data = args.data
    if data is None:
        data = os.path.join(root, "gsm8k")
        os.makedirs(data)
        with open(os.path.join(data, "test.jsonl"), "w") as f:
            for i in range(8):
                f.write(json.dumps({"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"}) + "\n")
    def evaluate(engine, out):
        start = time.perf_counter()
        status = cli(["eval", "--model", os.path.join(root, "model"), "--tasks", "gsm8k", "--data-dir",
                      os.path.dirname(data) if args.data else root, "--limit", "8", "--n", "2", "--mode", "cot",
                      "--max-new-tokens", args.max_new_tokens, "--engine", engine, "--out", out])
        assert status == 0
        return time.perf_counter() - start

    evaluate("eager", os.path.join(root, "warm-up"))  # imports and first calls, timed for neither
    engines = args.engines.split(",")
    times = {engine: [] for engine in engines}
    for r in range(args.rounds):
        for engine in engines if r % 2 == 0 else engines[::-1]:
            out = os.path.join(root, f"{engine}-{r}")
            times[engine].append(evaluate(engine, out))
            settings = json.load(open(os.path.join(out, "gsm8k.settings.json")))
            print(f"round {r} engine={engine}: {times[engine][-1]:.1f} s (settings: engine={settings.get('engine')})")
    total = {engine: sum(t) for engine, t in times.items()}
    print(f"{args.shape}, {args.layers} layers, {args.rounds} rounds: "
          + ", ".join(f"{engine} {t:.1f} s" for engine, t in total.items()))
    print(" ".join(f"{engine}/eager={t / total['eager']:.3f}" for engine, t in total.items() if engine != "eager"))


if __name__ == "__main__":
    main()
