"""The paper's result tables from ``tarpo eval`` results files, ours beside the paper's: Markdown and LaTeX.

:func:`build` places each results file by its ``system``, ``model_name`` and ``task`` into the paper's
own layouts (:mod:`tarpo.evaluation.paper`); :func:`markdown` and :func:`latex` render a built table.
What each cell reads and where our numbers come from: the ``tarpo table`` command, :mod:`tarpo.cli.table`.
"""

from __future__ import annotations

import glob
import json
import os

from ..algorithms import MODES
from . import paper

DASH = "–"
SUBSET_OF = {"math500": "math"}  # a math run reports its MATH-500 subset (tarpo eval)


def load_results(folder: str) -> dict[tuple[str, str, str, str], dict]:
    """``{(system, model_name, task, kind): results}``, kind ``greedy`` for ``--mode greedy`` runs
    and ``sampled`` otherwise; a duplicate key is an error naming both files."""
    if not os.path.isdir(folder):
        raise ValueError(f"{folder}: no such folder")
    found, where = {}, {}
    for path in sorted(glob.glob(os.path.join(folder, "**", "*.results.json"), recursive=True)):
        with open(path) as f:
            res = json.load(f)
        try:
            kind = "greedy" if res.get("mode") in MODES and MODES[res["mode"]].greedy else "sampled"
            key = (res["system"], res["model_name"], res["task"], kind)
        except KeyError as exc:
            raise ValueError(f"{path}: not a tarpo eval results file (no {exc.args[0]!r})") from None
        if key in found:
            raise ValueError(f"{path} and {where[key]} both hold {key}; keep one or use distinct --system labels")
        found[key], where[key] = res, path
    return found


def _metrics(results, system, model, task, kind) -> dict | None:
    res = results.get((system, model, task, kind))
    if res is not None:
        return res["metrics"]
    parent = results.get((system, model, SUBSET_OF.get(task), kind))
    sub = parent and parent.get("subsets", {}).get(task)
    return sub if sub and "pass@1" in sub else None


def our_value(results, system, model, task, metric) -> float | None:
    """One of our numbers in the paper's units (see the module doc), or None."""
    m = _metrics(results, system, model, task, "greedy" if metric == "greedy" else "sampled")
    if m is None:
        return None
    if metric == "greedy":
        metric = "pass@1"
    if metric.startswith(("pass@", "maj@")):
        return 100 * m[metric] if metric in m else None
    if metric == "sd":
        return m.get("accuracy_sd")
    if metric == "tokens":
        return m.get("units")
    if metric in ("ci_low", "ci_high") and "accuracy_mean" in m and "accuracy_ci95" in m:
        return 100 * (m["accuracy_mean"] + (1 if metric == "ci_high" else -1) * m["accuracy_ci95"])
    return None


def _expand(metric: str) -> tuple[str, ...]:
    return ("ci_low", "ci_high") if metric == "ci" else (metric,)


def row_values(results, system, model, groups) -> dict[tuple[str, str], float | None]:
    """``{(benchmark, metric): ours}`` for every cell of a row; ``average`` when all its parts exist."""
    out = {}
    plain = [g["benchmark"] for g in groups if g["benchmark"] != "average"]
    for g in groups:
        for col in g["columns"]:
            for metric in _expand(col["metric"]):
                if g["benchmark"] == "average":
                    parts = [our_value(results, system, model, b, metric) for b in plain]
                    out["average", metric] = sum(parts) / len(parts) if None not in parts else None
                else:
                    out[g["benchmark"], metric] = our_value(results, system, model, g["benchmark"], metric)
    return out


def _num(x: float | None, metric: str) -> str:
    return DASH if x is None else f"{x:.{paper.DECIMALS.get(metric, 2)}f}"


def cell(ours, published, metric: str, paper_only: bool = False) -> str:
    """``ours / paper (ours - paper)``; for a CI (``metric`` ``ci``) each side is a ``(low, high)`` pair.

    >>> cell(42.1, 42.36, "pass@1"), cell(None, 31.45, "pass@1"), cell(50.0, None, "pass@1"), cell(None, None, "sd")
    ('42.10 / 42.36 (-0.26)', '– / 31.45', '50.00 / –', '–')
    >>> cell(0.3, 0.344, "sd"), cell((59.1, 62.8), (59.03, 62.74), "ci"), cell(None, 31.45, "pass@1", paper_only=True)
    ('0.300 / 0.344 (-0.044)', '[59.10, 62.80] / [59.03, 62.74] (+0.07, +0.06)', '31.45')
    """
    names = _expand(metric)
    mine, theirs = (ours, published) if metric == "ci" else ((ours,), (published,))
    p_text = _side(theirs, names, paper.fmt)
    if paper_only:
        return p_text or DASH
    o_text = _side(mine, names, _num)
    if o_text is None and p_text is None:
        return DASH
    text = f"{o_text or DASH} / {p_text or DASH}"
    if None not in mine + theirs:
        diffs = ", ".join(f"{o - p:+.{paper.DECIMALS.get(n, 2)}f}" for o, p, n in zip(mine, theirs, names))
        text += f" ({diffs})"
    return text


def _side(values: tuple, names: tuple, render) -> str | None:
    """One side of a cell: a value, or ``[low, high]`` for a CI; None when nothing is there."""
    if all(v is None for v in values):
        return None
    text = ", ".join(DASH if v is None else render(v, n) for v, n in zip(values, names))
    return f"[{text}]" if len(names) > 1 else text


def _columns(table) -> list[tuple[str, str]]:
    return [(g["benchmark"], c["metric"]) for g in table["groups"] for c in g["columns"]]


def build(number, results: dict | None, spec: dict | None = None) -> dict:
    """Paper table ``number`` filled from ``results`` (None: the published values alone):
    ``{number, title, notes, row_headers, headers: [(group label, [sub-headers])], sectioned,
    sections: [{model, rows: [{label, indent, rule_before, cells}]}]}``."""
    spec = spec or paper.paper_tables()
    table = spec["tables"][str(number)]
    published = {(c["model"], c["system"], c["benchmark"], c["metric"]): c["value"]
                 for c in spec["published"] if c["table"] == int(number)}
    declared_models = {s["model"] for t in spec["tables"].values() for s in t["sections"]}
    declared_systems = {r["system"] for t in spec["tables"].values() for s in t["sections"] for r in s["rows"]}
    paper_only, results = results is None, results or {}
    pad = [""] * (len(table["row_headers"]) - 1)

    def make_row(model, row):
        values = row_values(results, row["system"], model, table["groups"])
        cells = []
        for bench, metric in _columns(table):
            ours = tuple(values[bench, n] for n in _expand(metric))
            theirs = tuple(published.get((model, row["system"], bench, n)) for n in _expand(metric))
            if metric != "ci":
                (ours,), (theirs,) = ours, theirs
            cells.append(cell(ours, theirs, metric, paper_only))
        has_ours = any(v is not None for v in values.values())
        return {"label": row["label"], "indent": bool(row.get("indent")), "rule_before": bool(row.get("rule_before")),
                "cells": cells}, has_ours

    def extra_rows(model, systems):
        rows = []
        for system in systems:
            row, has_ours = make_row(model, {"system": system, "label": [system] + pad})
            if has_ours:
                rows.append(row)
        return rows

    sections = []
    for sec in table["sections"]:
        ours_here = sorted({k[0] for k in results if k[1] == sec["model"]} - declared_systems)
        rows = [make_row(sec["model"], r)[0] for r in sec["rows"]]
        sections.append({"model": sec["model"], "rows": rows + extra_rows(sec["model"], ours_here)})
    table_systems = list(dict.fromkeys(r["system"] for s in table["sections"] for r in s["rows"]))
    for model in sorted({k[1] for k in results} - declared_models):
        ours_here = sorted({k[0] for k in results if k[1] == model} - declared_systems)
        rows = extra_rows(model, table_systems + ours_here)
        if rows:
            sections.append({"model": model, "rows": rows})
    return {"number": int(number), "title": table["title"], "notes": table["notes"], "paper_only": paper_only,
            "row_headers": table["row_headers"],
            "sectioned": table["sectioned"] or len(sections) > len(table["sections"]),
            "headers": [(g["label"], [c["header"] for c in g["columns"]]) for g in table["groups"]],
            "sections": sections}


def _flat_headers(t) -> list[str]:
    return t["row_headers"] + [f"{label} {h}".strip() for label, subs in t["headers"] for h in subs]


def _legend(t) -> str:
    return "Published values." if t["paper_only"] else "Cells: ours / paper (ours - paper); – = no value."


def markdown(t: dict) -> str:
    header = _flat_headers(t)
    lines = [f"### {t['title']}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for sec in t["sections"]:
        if t["sectioned"]:
            lines.append(f"| **{sec['model']}** |" + " |" * (len(header) - 1))
        for row in sec["rows"]:
            label = [("↳ " if row["indent"] else "") + row["label"][0]] + row["label"][1:]
            lines.append("| " + " | ".join(label + row["cells"]) + " |")
    notes = [_legend(t)] + t["notes"]
    return "\n".join(lines) + "\n\n" + "\n".join(f"_{n}_" for n in notes) + "\n"


_TEX = {"&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", DASH: "--", "$": r"\$", "✓": r"$\checkmark$",
        "×": r"$\times$"}


def _tex(s: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in s)


def latex(t: dict) -> str:
    """The table in the paper's LaTeX layout (needs booktabs, multirow and graphicx)."""
    nrow = len(t["row_headers"])
    ncols = nrow + sum(len(subs) for _, subs in t["headers"])
    two_rows = any(h for _, subs in t["headers"] for h in subs)
    spec = "l" * nrow + " " + " ".join("c" * len(subs) for _, subs in t["headers"])
    lines = [r"\begin{table*}[t]", r"\centering", r"\small", r"\resizebox{\textwidth}{!}{",
             r"\begin{tabular}{" + spec + "}", r"\toprule"]
    if two_rows:
        first = [r"\multirow{2}{*}{" + _tex(h) + "}" for h in t["row_headers"]]
        first += [r"\multicolumn{" + str(len(subs)) + "}{c}{" + _tex(label) + "}" for label, subs in t["headers"]]
        rules, start = [], nrow + 1
        for _, subs in t["headers"]:
            rules.append(rf"\cmidrule(lr){{{start}-{start + len(subs) - 1}}}")
            start += len(subs)
        lines += [" & ".join(first) + r" \\", " ".join(rules),
                  " & ".join([""] * nrow + [_tex(h) for _, subs in t["headers"] for h in subs]) + r" \\"]
    else:
        lines.append(" & ".join(_tex(h) for h in t["row_headers"] + [label for label, _ in t["headers"]]) + r" \\")
    lines.append(r"\midrule")
    for sec in t["sections"]:
        if t["sectioned"]:
            lines += [r"\midrule", r"\multicolumn{" + str(ncols) + "}{c}{" + _tex(sec["model"]) + r"} \\", r"\midrule"]
        for row in sec["rows"]:
            if row["rule_before"]:
                lines.append(r"\midrule")
            label = [_tex(x) for x in row["label"]]
            if row["indent"]:
                label[0] = r"$\quad$ \textit{" + label[0] + "}"
            lines.append(" & ".join(label + [_tex(c) for c in row["cells"]]) + r" \\")
    caption = " ".join([t["title"].split(": ", 1)[1], _legend(t)] + t["notes"])
    lines += [r"\bottomrule", r"\end{tabular}", "}", r"\caption{" + _tex(caption) + "}", r"\end{table*}"]
    return "\n".join(lines) + "\n"
