"""The launcher's CPU estimate against the run it estimates (tarpo/runs/cpu_estimate.py).

A random Llama of SmolLM2-135M's published shape (30 layers, d 576, vocabulary 49,152, tied embeddings;
fp32, as a CPU run trains) is saved to a temporary folder with a small BPE tokenizer, and
``bash run_gsm8k.sh`` trains it for ``--steps`` steps on the GSM8K folder ``--data``. The script prints the
estimate the launcher printed, the ``train_runtime`` the Trainer reported and their ratio (the issue's bound:
within 2x). Random weights never write an end token, so every completion runs to
``MAX_COMPLETION_LENGTH``: this measures the probe's speeds; its length probe, which a chat model that
ends early needs, is tested in tests/test_cpu_estimate.py.

    python benchmarks/bench_cpu_estimate.py --data ../shared/data/gsm8k [--steps 2] [--completion 128]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import torch

from tarpo.models.tiny import random_model_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                    rms_norm_eps=1e-5, tie_word_embeddings=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a local GSM8K folder (train.jsonl)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--completion", type=int, default=128, help="MAX_COMPLETION_LENGTH")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-cpu-estimate-")
    model = random_model_dir(os.path.join(root, "smollm2-135m-shape"), SMOLLM2_135M, dtype=torch.float32, arch="llama")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MODEL": model, "DATA_PATH": os.path.abspath(args.data),
           "MAX_STEPS": str(args.steps), "BATCH": str(args.batch), "GROUP_SIZE": "4",
           "MAX_COMPLETION_LENGTH": str(args.completion), "OUT_DIR": os.path.join(root, "runs"), "RUN_NAME": "r"}
    res = subprocess.run(["bash", os.path.join(ROOT, "run_gsm8k.sh")], env=env, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(res.stdout[-3000:] + res.stderr[-3000:])
    line = next(x for x in res.stdout.splitlines() if x.startswith("CPU estimate:"))
    estimate = float(re.search(r"steps: ([\d.]+) (s|h) ", line)[1]) * (3600 if " h (" in line else 1)
    runtime = float(re.search(r"'train_runtime': '([\d.]+)'", res.stdout)[1])
    print(line)
    print(f"estimate {estimate:.0f} s, train_runtime {runtime:.0f} s, estimate / runtime {estimate / runtime:.2f}")


if __name__ == "__main__":
    main()
