#!/usr/bin/env python3
"""How fast this CPU runs the kind of work the project's suite does, so that timings from two machines compare.

    python benchmarks/cpu_score.py        # about 30 s; the last line is one JSON object

Three fixed workloads, each timed as the best of three rounds (seconds, lower is faster):
  torch_s   a small causal transformer (4 layers, d=256, 8 heads, 64 x 128 tokens): forward and backward, on the
            threads torch chooses here
  torch1_s  the same on one thread (what one pytest-xdist worker of two gets)
  python_s  interpreter work: dicts, strings, json and small lists (tokenizers, graders, bookkeeping)
  import_s  a fresh `python -c "import torch, transformers, trl"` (disk and import machinery)
A figure from another machine scales by the ratio of the two machines' scores, e.g. a suite time measured there
times (torch1_s here / torch1_s there) estimates the suite's time here.
"""
import json
import os
import platform
import subprocess
import sys
import time


def best(fn, rounds=3):
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(min(times), 3)


def torch_work(threads=None):
    import torch
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
    x = torch.randn(64, 128, 256)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(128)

    def run():
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            model(x, mask=mask, is_causal=True).square().mean().backward()
    run()  # warm-up
    return best(run)


def python_work():
    def run():
        d = {}
        for i in range(300_000):
            d[f"k{i % 5000}"] = d.get(f"k{i % 5000}", 0) + i
        s = json.dumps([{"q": str(i), "a": [i, i * 2, "x" * (i % 7)]} for i in range(60_000)])
        json.loads(s)
        sorted(str(i)[::-1] for i in range(200_000))
    return best(run)


def import_work():
    def run():
        subprocess.run([sys.executable, "-c", "import torch, transformers, trl"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return best(run, rounds=2)


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    import torch
    out = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
           "torch_threads": torch.get_num_threads()}
    out["torch_s"] = torch_work()
    out["torch1_s"] = torch_work(threads=1)
    out["python_s"] = python_work()
    out["import_s"] = import_work()
    print(json.dumps(out))
