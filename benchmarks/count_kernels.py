"""The kernels of a compiled graph, counted in inductor's generated code (here: the decode step's launches).

    TORCH_LOGS=output_code python benchmarks/bench_write_positions.py ... 2> code.log
    python benchmarks/count_kernels.py code.log [--json out.json --key NAME]

Inductor logs the Python module it generates for each graph; its ``call`` function launches, in order, every
fused kernel it generated (Triton ``<kernel>.run(`` on a GPU, C++ ``cpp_fused_*(`` on the CPU), every matmul it
left to a library (``extern_kernels.mm`` / ``addmm`` / ``bmm`` ...) and the ATen ops it calls as they are
(``torch.ops.aten.*``, e.g. the attention kernel). The largest ``call`` of the log is counted (the decode step's
graph, far the largest of a rollout), with the attention ops named; a nested compile region's subgraph (one
generated function, called once per layer) counts once per call.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys

FUSED = re.compile(r"^\s+(\w+)\.run\(|^\s+(cpp_fused_\w+)\(")
EXTERN = re.compile(r"extern_kernels\.(\w+)\(")
ATEN = re.compile(r"(?<!')torch\.ops\.aten\.(\w+)\.\w+\(")  # a call (the size asserts name ops in quotes)
PREFIX = re.compile(r"^.*?\[__output_code\] ?")  # the logger's prefix of each line


def functions(text: str) -> list[tuple[str, list[str]]]:
    """``(name, lines)`` of every function inductor generated in the log: each graph's ``call`` and the
    subgraphs of nested compile regions (``def <name>(args):``, called from ``call`` once per use)."""
    found, current = [], None
    for line in text.splitlines():
        line = PREFIX.sub("", line)
        start = re.match(r"\s*def (\w+)\((self, )?args\):", line)
        if start:
            current = []
            found.append((start.group(1), current))
        elif current is not None:
            if re.match(r"\s*def \w+\(", line) or line.startswith(("class ", "if __name__")) or "Output code" in line:
                current = None
            else:
                current.append(line)
    return found


def count(lines: list[str], subgraphs: dict | None = None) -> dict:
    """Launches of one generated function; a call of a subgraph in ``subgraphs`` counts that subgraph's."""
    lines = [line for line in lines if not line.lstrip().startswith("#")]  # the source comments name ATen ops
    fused = sum(1 for line in lines if FUSED.search(line))
    extern = collections.Counter(m.group(1) for line in lines for m in EXTERN.finditer(line))
    aten = collections.Counter(m.group(1) for line in lines for m in ATEN.finditer(line))
    for name, sub in (subgraphs or {}).items():
        uses = sum(1 for line in lines if re.search(rf"= {name}\(", line))
        fused += uses * sub["fused_kernels"]
        extern.update({k: uses * v for k, v in sub["extern_calls"].items()})
        aten.update({k: uses * v for k, v in sub["aten_calls"].items()})
    return {"fused_kernels": fused, "extern_calls": dict(extern), "aten_calls": dict(aten),
            "launches": fused + sum(extern.values()) + sum(aten.values()),
            "attention": {k: v for k, v in {**extern, **aten}.items() if "attention" in k}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--json")
    ap.add_argument("--key", default="kernels")
    args = ap.parse_args()
    found = functions(open(args.log, errors="replace").read())
    calls = [lines for name, lines in found if name == "call"]
    if not calls:
        sys.exit(f"{args.log}: no generated 'def call(' in it (was TORCH_LOGS=output_code set, and inductor used?)")
    subgraphs = {name: count(lines) for name, lines in found if name != "call"}
    res = count(max(calls, key=len), subgraphs)
    res["graphs_in_log"], res["subgraphs"] = len(calls), sorted(subgraphs)
    print(json.dumps(res, indent=1))
    if args.json:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        from results_file import record
        record(args.json, args.key, res)


if __name__ == "__main__":
    main()
