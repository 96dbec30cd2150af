"""``tarpo table``: the paper's tables from a folder of ``tarpo eval`` results, ours beside the paper's.

    tarpo table runs/ --tables 1,4 --out runs/tables

Reads every ``*.results.json`` under the folder (recursively), places each by its
``system`` (``tarpo eval --system``), ``model_name`` and ``task`` into the layouts of
``resources/paper_tables.json`` (Tables 1-8), and prints Markdown; ``--out`` also writes
``tables.md`` and ``tables.tex``. Each cell reads ``ours / paper (ours - paper)`` in percent
(``#Tok``: mean units); a missing value is ``–``. A MATH500 column takes a ``math500``
results file, or else the MATH-500 subset of the ``math`` run. ``Avg`` averages the row's
columns when all are present. Models that no table names (e.g. a tiny local model) appear
in the tables marked ``extra_models``; systems not in a table's list are appended as rows.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from importlib import resources

from .files import write_text_atomic

DASH = "–"


def paper_tables() -> dict:
    return json.loads(resources.files("tarpo").joinpath("resources/paper_tables.json").read_text())


def load_results(folder: str) -> dict[tuple[str, str, str], dict]:
    """``{(system, model_name, task): results}``; a duplicate key is an error naming both files."""
    if not os.path.isdir(folder):
        raise ValueError(f"{folder}: no such folder")
    found, where = {}, {}
    for path in sorted(glob.glob(os.path.join(folder, "**", "*.results.json"), recursive=True)):
        with open(path) as f:
            res = json.load(f)
        try:
            key = (res["system"], res["model_name"], res["task"])
        except KeyError as exc:
            raise ValueError(f"{path}: not a tarpo eval results file (no {exc.args[0]!r})") from None
        if key in found:
            raise ValueError(f"{path} and {where[key]} both hold {key}; keep one or use distinct --system labels")
        found[key], where[key] = res, path
    return found


def _value(results, system, model, column) -> tuple[float | None, float | None]:
    """(value, ci half-width) of one plain column, as displayed (percent unless units)."""
    res = results.get((system, model, column["task"]))
    metrics = res["metrics"] if res else None
    if metrics is None and column.get("subset_of"):
        parent = results.get((system, model, column["subset_of"]))
        sub = parent and parent.get("subsets", {}).get(column["task"])
        metrics = sub if sub and "pass@1" in sub else None
    if metrics is None or column["metric"] not in metrics:
        return None, None
    scale = 1.0 if column["metric"] == "units" else 100.0
    return metrics[column["metric"]] * scale, metrics.get("accuracy_ci95", 0.0) * scale


def row_values(results, system, model, columns) -> dict[str, tuple[float | None, float | None]]:
    out = {}
    for col in columns:
        if "average_of" in col:
            metric = col.get("metric", "pass@1")
            parts = [_value(results, system, model, {**c, "metric": metric})[0]
                     for c in columns if c["label"] in col["average_of"]]
            out[col["label"]] = (sum(parts) / len(parts) if parts and None not in parts else None, None)
        else:
            out[col["label"]] = _value(results, system, model, col)
    return out


def _fmt(x: float | None) -> str:
    return DASH if x is None else f"{x:.2f}"


def cell(ours: float | None, paper: float | None, ci: float | None = None) -> str:
    """``ours / paper (diff)``; ``ours ± ci`` when a CI is shown.

    >>> cell(42.1, 42.36), cell(None, 31.45), cell(50.0, None), cell(None, None), cell(50.0, None, 1.234)
    ('42.10 / 42.36 (-0.26)', '– / 31.45', '50.00 / –', '–', '50.00 ± 1.23 / –')
    """
    if ours is None and paper is None:
        return DASH
    mine = _fmt(ours) if ci is None or ours is None else f"{ours:.2f} ± {ci:.2f}"
    text = f"{mine} / {_fmt(paper)}"
    return text + (f" ({ours - paper:+.2f})" if ours is not None and paper is not None else "")


def build(number: str, results: dict, spec: dict | None = None) -> tuple[str, list[str], list[list[str]]]:
    """(title, header, rows of cells) of paper table ``number``."""
    spec = spec or paper_tables()
    table = spec["tables"][number]
    declared = {m for t in spec["tables"].values() for m in t["models"]}
    models = list(table["models"])
    if table.get("extra_models"):
        models += sorted({m for _, m, _ in results} - declared)
    published = {(p["model"], p["system"], p["column"]): p["value"] for p in spec["published"] if p["table"] == number}
    header = ["Model", "System"] + [c["label"] for c in table["columns"]]
    rows = []
    for model in models:
        systems = list(table["systems"]) + sorted({s for s, m, _ in results if m == model} - set(table["systems"]))
        for system in systems:
            values = row_values(results, system, model, table["columns"])
            cells = [cell(values[c["label"]][0], published.get((model, system, c["label"])),
                          values[c["label"]][1] if c.get("ci") else None) for c in table["columns"]]
            if system in table["systems"] or any(c != DASH for c in cells):
                rows.append([model, system] + cells)
    return table["title"], header, rows


def markdown(title: str, header: list[str], rows: list[list[str]]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows] or [f"| {DASH} |"]
    return "\n".join(lines) + "\n\n_Cells: ours / paper (ours - paper); – = no value._\n"


_TEX = {"&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "±": r"$\pm$", DASH: "--", "$": r"\$"}


def _tex(s: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in s)


def latex(title: str, header: list[str], rows: list[list[str]]) -> str:
    lines = [r"\begin{table}[t]", r"\centering", r"\caption{" + _tex(title) + "}", r"\small",
             r"\begin{tabular}{ll" + "c" * (len(header) - 2) + "}", r"\toprule",
             " & ".join(_tex(h) for h in header) + r" \\", r"\midrule"]
    lines += [" & ".join(_tex(c) for c in r) + r" \\" for r in rows]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", help="folder searched recursively for *.results.json")
    p.add_argument("--tables", default="1,2,3,4,5,6,7,8", help="comma-separated table numbers")
    p.add_argument("--out", help="folder for tables.md and tables.tex")


def run(args) -> int:
    spec = paper_tables()
    numbers = [t.strip() for t in args.tables.split(",") if t.strip()]
    bad = [t for t in numbers if t not in spec["tables"]]
    if bad:
        raise ValueError(f"--tables: no table {', '.join(bad)}; the paper's tables are {', '.join(spec['tables'])}")
    results = load_results(args.results)
    built = [build(n, results, spec) for n in numbers]
    md = "\n".join(markdown(*b) for b in built)
    print(md)
    if args.out:
        write_text_atomic(os.path.join(args.out, "tables.md"), md)
        write_text_atomic(os.path.join(args.out, "tables.tex"), "\n".join(latex(*b) for b in built))
        print(f"wrote {os.path.join(args.out, 'tables.md')} and tables.tex")
    return 0
