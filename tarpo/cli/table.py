"""``tarpo table``: the paper's result tables from a folder of ``tarpo eval`` results, ours beside the paper's.

    tarpo table runs/ --tables 1,4,12 --out runs/tables
    tarpo table --paper                 # the published tables alone
    tarpo table --paper --json          # every published cell as one JSON list

Reads every ``*.results.json`` under the folder (recursively) and places each by its
``system`` (``tarpo eval --system``), ``model_name`` and ``task`` into the paper's own
layouts (:mod:`tarpo.evaluation.paper`: Tables 1-5 and 8-14, their columns, model sections and row
names), then prints Markdown; ``--out`` also writes ``tables.md`` and ``tables.tex``.
Each cell reads ``ours / paper (ours - paper)``; a missing value is ``–``. Accuracies are
in percent, SD a fraction, #Tok mean generated units (hard + soft), a CI ``[low, high]``.

Where our numbers come from: P@k and M@k are ``pass@k``/``maj@k`` of a results file (so
P@32 and M@32 need ``--n 32``); SD is ``accuracy_sd``; the CI is ``accuracy_mean`` ±
``accuracy_ci95``; #Tok is ``units``; Greedy (Table 3) is ``pass@1`` of a ``--mode greedy``
run (TARPO: ``--mode tarpo_greedy``, argmax tokens and routing) given the row's ``--system``
(greedy and sampled runs of one system sit side by side).
A MATH500 column takes a ``math500`` results file, or else the MATH-500 subset of the
``math`` run. Average columns average the row's benchmarks when all are present. The
ablation rows are the systems ``GRPO w/ Pure Latent`` and ``GRPO w/ Entropy Routing``;
the bias/Act-KL rows of Tables 8-10 are ``TARPO b0=[4.6, 0] w/ Act-KL`` and the like.
Models no table names (e.g. a tiny local model) get sections of their own; systems no
table names are appended to their model's section.
"""

from __future__ import annotations

import argparse
import json
import os

from ..evaluation import paper
from ..evaluation.tables import build, latex, load_results, markdown
from ..atomic_files import write_text_atomic


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="?", help="folder searched recursively for *.results.json")
    p.add_argument("--tables", help="comma-separated table numbers (default: all, 1-5 and 8-14)")
    p.add_argument("--paper", action="store_true", help="the published tables alone, without results")
    p.add_argument("--json", action="store_true", help="with --paper: print every published cell as one JSON list")
    p.add_argument("--out", help="folder for tables.md and tables.tex")


def _numbers(arg: str | None, spec: dict) -> list[int]:
    known = sorted(int(n) for n in spec["tables"])
    if not arg:
        return known
    numbers = []
    for text in (t.strip() for t in arg.split(",") if t.strip()):
        if not text.isdigit() or int(text) not in known:
            why = (f"Table {text} holds no results ({spec['not_results'][text]})" if text in spec["not_results"]
                   else f"no table {text}")
            raise ValueError(f"--tables: {why}; the paper's result tables are {', '.join(map(str, known))}")
        numbers.append(int(text))
    return numbers


def run(args) -> int:
    spec = paper.paper_tables()
    numbers = _numbers(args.tables, spec)
    if args.json and not args.paper:
        raise ValueError("--json prints the published cells: use it with --paper")
    if args.paper and args.results:
        raise ValueError("--paper shows the published tables alone: leave out the results folder")
    if not args.paper and not args.results:
        raise ValueError("give a folder of tarpo eval results, or --paper for the published tables")
    if args.json:
        print("[\n" + ",\n".join(json.dumps(c) for c in paper.published(numbers)) + "\n]")
        return 0
    results = None if args.paper else load_results(args.results)
    built = [build(n, results, spec) for n in numbers]
    md = "\n".join(markdown(t) for t in built)
    print(md)
    if args.out:
        write_text_atomic(os.path.join(args.out, "tables.md"), md)
        write_text_atomic(os.path.join(args.out, "tables.tex"), "\n".join(latex(t) for t in built))
        print(f"wrote {os.path.join(args.out, 'tables.md')} and tables.tex")
    return 0
