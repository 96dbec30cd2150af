#!/usr/bin/env python
"""Transcribe the paper's result tables from its LaTeX source into ``tarpo/resources/paper_tables.json``.

    python scripts/transcribe_paper_tables.py PATH/TO/tarpo.tex            # rewrite the packaged file
    python scripts/transcribe_paper_tables.py PATH/TO/tarpo.tex --check    # exit 1 if it differs

Not part of the package's run path: ``tarpo table`` only reads the JSON this writes.
Tables are numbered as the compiled paper numbers them, the k-th ``table``/``table*``
environment being Table k. Every result table is parsed: its column groups and metric
sub-headers, its model sections (``\\multicolumn`` rows; a table without them names its
model in the caption), its row names and the rules between rows, and every numeric cell
(an empty cell is a number the paper does not publish; ``[a, b]`` is a CI's two ends).
Tables 6, 7 and 15 hold settings and licenses, not results, and are skipped by name.
The layout of each table and the flat list of published cells
(``{table, model, system, benchmark, metric, value}``) go into the JSON; values are
as printed (percent, SD as a fraction, #Tok in units).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tarpo", "resources", "paper_tables.json")

# The label of each table environment in order: the numbering check. None = not a results table.
LABELS = {1: "tab:main_results", 2: "tab:Llama_generalization", 3: "tab:reparam_comparison", 4: "tab:ood_results",
          5: "tab:ablation_results", 6: None, 7: None, 8: "tab:bias_kl_3b", 9: "tab:bias_kl_id",
          10: "tab:bias_kl_ood", 11: "tab:m32_sd", 12: "tab:ci", 13: "tab:ood_stats", 14: "tab:llama_stats",
          15: None}
NOT_RESULTS = {6: ("tab:all_hyperparameters", "hyperparameter settings"),
               7: ("tab:length_settings", "maximum prompt and completion lengths"), 15: ("tab:licenses", "licenses")}

BENCHMARKS = {"GSM8K": "gsm8k", "MATH": "math", "MATH500": "math500", "AMC23": "amc23", "Olympiad": "olympiadbench",
              "OlympiadBench": "olympiadbench", "GPQA-Diamond": "gpqa_diamond", "ARC-C": "arc_challenge",
              "HumanEval": "humaneval", "Average": "average"}
METRICS = {"P@1": "pass@1", "P@32": "pass@32", "M@32": "maj@32", "SD": "sd", "95% CI": "ci", "#Tok": "tokens",
           "Greedy": "greedy"}
ROW_HEADERS = ("Method", "Bias", "Act-KL")
MODEL = re.compile(r"(?:Qwen2\.5-[0-9.]+B|Llama-3\.1-8B)-Instruct")
NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def strip_comments(tex: str) -> str:
    return "\n".join(re.sub(r"(?<!\\)%.*", "", line) for line in tex.splitlines())


def braced(text: str, start: int) -> tuple[str, int]:
    """The balanced ``{...}`` group opening at ``text[start]``: (content, index after it)."""
    if text[start] != "{":
        raise ValueError(f"expected '{{' at {text[start:start + 30]!r}")
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i], i + 1
    raise ValueError("unbalanced braces")


def command_arg(text: str, name: str) -> str | None:
    m = re.search(r"\\" + name + r"\s*(?=\{)", text)
    return braced(text, m.end())[0] if m else None


def environments(tex: str) -> list[str]:
    """The body of every ``table``/``table*`` environment, in source order."""
    return [m.group(2) for m in re.finditer(r"\\begin\{table(\*?)\}(.*?)\\end\{table\1\}", tex, re.S)]


def unwrap(cell: str) -> str:
    """Cell text without formatting: ``\\textbf{x}``, ``\\multirow{2}{*}{x}``, ``$...$``, escapes."""
    cell = cell.strip()
    m = re.fullmatch(r"\\multirow\{[^}]*\}\{[^}]*\}\{(.*)\}", cell, re.S)
    if m:
        cell = m.group(1)
    for _ in range(3):
        cell = re.sub(r"\\text(?:bf|it)\{([^{}]*)\}", r"\1", cell)
    cell = cell.replace(r"\%", "%").replace(r"\#", "#").replace("$", "").strip()
    return re.sub(r"\s+", " ", cell)


def split_cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)&", row)]


def caption_text(caption: str) -> str:
    text = re.sub(r"\\citet?\{([^}]*)\}", r"[\1]", caption)
    text = re.sub(r"\\text(?:bf|it)\{([^{}]*)\}", r"\1", text)
    text = re.sub(r"\$\\?([^$]*)\$", r"\1", text).replace(r"\%", "%").replace("{", "").replace("}", "")
    return re.sub(r"\s+", " ", text).strip()


def short_title(caption: str) -> str:
    """The caption's first sentence."""
    m = re.match(r"(.+?\.)(?:\s|$)", caption)
    return (m.group(1) if m else caption).strip()


def parse_header(rows: list[str], number: int, caption: str) -> tuple[list[str], list[dict]]:
    """(row-header names, column groups ``{label, benchmark, columns: [{header, metric}]}``)."""
    first = split_cells(rows[0])
    row_headers = []
    while first and unwrap(first[0]) in ROW_HEADERS:
        row_headers.append(unwrap(first.pop(0)))
    if not row_headers:
        raise ValueError(f"Table {number}: no row header in {rows[0]!r}")
    groups = []
    for c in first:
        m = re.fullmatch(r"\\multicolumn\{(\d+)\}\{[^}]*\}\{(.*)\}", c, re.S)
        span, label = (int(m.group(1)), unwrap(m.group(2))) if m else (1, unwrap(c))
        groups.append({"label": label, "benchmark": BENCHMARKS[label], "span": span})
    if len(rows) == 1:  # one header row: every group is a single CI column (Table 12)
        if not all(g["span"] == 1 for g in groups) or "Confidence Intervals" not in caption:
            raise ValueError(f"Table {number}: a one-row header is only expected for the CI table")
        subs = ["95% CI"] * len(groups)
    elif len(rows) == 2:
        subs = [unwrap(c) for c in split_cells(rows[1])]
        if any(subs[:len(row_headers)]):
            raise ValueError(f"Table {number}: metric header row does not leave the row-header cells empty")
        subs = subs[len(row_headers):]
    else:
        raise ValueError(f"Table {number}: {len(rows)} header rows")
    if len(subs) != sum(g["span"] for g in groups):
        raise ValueError(f"Table {number}: {len(subs)} metric headers for {sum(g['span'] for g in groups)} columns")
    out, i = [], 0
    for g in groups:
        out.append({"label": g["label"], "benchmark": g["benchmark"],
                    "columns": [{"header": "" if len(rows) == 1 else h, "metric": METRICS[h]}
                                for h in subs[i:i + g["span"]]]})
        i += g["span"]
    return row_headers, out


def row_system(labels: list[str], parent: str | None) -> tuple[str, list[str], bool]:
    """(system, label cells as printed, indented) of one data row."""
    if len(labels) == 2:  # Bias, Act-KL
        bias, kl = labels
        if not re.fullmatch(r"\[[0-9.]+, ?[0-9.]+\]", bias) or kl not in (r"\times", r"\checkmark"):
            raise ValueError(f"unexpected bias/Act-KL labels {labels}")
        on = kl == r"\checkmark"
        return f"TARPO b0={bias} {'w/' if on else 'w/o'} Act-KL", [bias, "✓" if on else "×"], False
    (label,) = labels
    if label.startswith(r"\quad"):
        child = label[len(r"\quad"):].strip()
        if parent is None:
            raise ValueError(f"indented row {child!r} has no parent row")
        return f"{parent} {child}", [child], True
    name = re.sub(r"\s*\(Ours\)$", "", label)
    return name, [name], False


def parse_table(number: int, body: str) -> tuple[dict, list[dict]]:
    caption = caption_text(command_arg(body, "caption"))
    m = re.search(r"\\begin\{tabular\}\{[^}]*\}(.*?)\\end\{tabular\}", body, re.S)
    head, rest = re.split(r"\\midrule", m.group(1), maxsplit=1)
    head = re.sub(r"\\(?:toprule|cmidrule(?:\([^)]*\))?\{[^}]*\})", "", head)
    header_rows = [r.strip() for r in re.split(r"\\\\", head) if r.strip()]
    row_headers, groups = parse_header(header_rows, number, caption)
    columns = [(g["benchmark"], c["metric"]) for g in groups for c in g["columns"]]
    models = sorted(set(MODEL.findall(caption)))
    default_model = models[0] if len(models) == 1 else None
    sections, cells, rule = [], [], False
    parent = None
    for piece in re.split(r"(\\midrule|\\bottomrule|\\\\)", rest):
        piece = piece.strip()
        if piece in (r"\midrule", r"\bottomrule"):
            rule = True
            continue
        if piece in ("", r"\\"):
            continue
        section = re.fullmatch(r"\\multicolumn\{(\d+)\}\{c\}\{([^}]*)\}", piece)
        if section:
            sections.append({"model": section.group(2).strip(), "rows": []})
            rule, parent = False, None
            continue
        if not sections:
            if default_model is None:
                raise ValueError(f"Table {number}: rows before any model section and no single model in the caption")
            sections.append({"model": default_model, "rows": []})
            rule = False
        raw = split_cells(piece)
        labels, values = [unwrap(c) for c in raw[:len(row_headers)]], [unwrap(c) for c in raw[len(row_headers):]]
        if len(values) != len(columns):
            raise ValueError(f"Table {number}: {len(values)} values for {len(columns)} columns in {piece!r}")
        system, shown, indented = row_system(labels, parent)
        if not indented:
            parent = system
        row = {"system": system, "label": shown}
        if indented:
            row["indent"] = True
        if system.endswith("*"):
            row["external"] = True
        if rule and sections[-1]["rows"]:
            row["rule_before"] = True
        rule = False
        sections[-1]["rows"].append(row)
        for (benchmark, metric), text in zip(columns, values):
            cells += [{"table": number, "model": sections[-1]["model"], "system": system, "benchmark": benchmark,
                       "metric": name, "value": value} for name, value in parse_value(text, metric, number)]
    notes = []
    if any(r.get("external") for s in sections for r in s["rows"]):
        star = re.search(r"Results marked with \* [^.]*\.", caption)
        notes.append(star.group(0) if star else "Rows marked * are taken from another paper.")
    spec = {"title": f"Table {number}: {short_title(caption)}", "caption": caption,
            "label": command_arg(body, "label"), "row_headers": row_headers, "sectioned": default_model is None,
            "groups": groups, "sections": sections, "notes": notes}
    return spec, cells


def parse_value(text: str, metric: str, number: int) -> list[tuple[str, float]]:
    """The published numbers of one printed cell (none for an empty cell)."""
    if not text:
        return []
    if metric == "ci":
        m = re.fullmatch(r"\[\s*(" + NUMBER.pattern + r")\s*,\s*(" + NUMBER.pattern + r")\s*\]", text)
        if not m:
            raise ValueError(f"Table {number}: CI cell {text!r} is not [low, high]")
        return [("ci_low", float(m.group(1))), ("ci_high", float(m.group(2)))]
    if not NUMBER.fullmatch(text):
        raise ValueError(f"Table {number}: cell {text!r} is not a number")
    return [(metric, float(text))]


def transcribe(tex: str) -> dict:
    envs = environments(strip_comments(tex))
    if len(envs) != len(LABELS):
        raise ValueError(f"{len(envs)} table environments; expected {len(LABELS)}")
    tables, published = {}, []
    for number, body in enumerate(envs, 1):
        label = command_arg(body, "label")
        if LABELS[number] is None:
            if label != NOT_RESULTS[number][0]:
                raise ValueError(f"Table {number} is {label}, expected the non-result table {NOT_RESULTS[number][0]}")
            continue
        if label != LABELS[number]:
            raise ValueError(f"Table {number} is {label}, expected {LABELS[number]}")
        tables[str(number)], cells = parse_table(number, body)
        published += cells
    return {
        "_source": "Transcribed by scripts/transcribe_paper_tables.py from the LaTeX source of the TARPO paper "
                   "(arXiv:2606.05859v1); do not edit by hand. Tables are numbered as the compiled paper numbers "
                   "them; Tables 6, 7 and 15 (hyperparameters, length settings, licenses) hold no results. "
                   "Values are as printed: accuracies in percent, SD as a fraction, #Tok in units.",
        "not_results": {str(k): f"{what} ({label})" for k, (label, what) in NOT_RESULTS.items()},
        "tables": tables,
        "published": published,
    }


def dumps(value, indent: str = "", width: int = 160) -> str:
    """JSON text: a value on one line when it fits in ``width``, else one item per line."""
    flat = json.dumps(value, ensure_ascii=False)
    if len(indent) + len(flat) <= width or not isinstance(value, (dict, list)) or not value:
        return flat
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {dumps(v, inner, width)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    return "[\n" + ",\n".join(inner + dumps(v, inner, width) for v in value) + "\n" + indent + "]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tex", help="the paper's LaTeX source")
    ap.add_argument("--out", default=OUT,
                    help="JSON to write (default: the packaged tarpo/resources/paper_tables.json)")
    ap.add_argument("--check", action="store_true",
                    help="compare with --out instead of writing it; exit 1 if different")
    args = ap.parse_args(argv)
    with open(args.tex, encoding="utf-8") as f:
        text = dumps(transcribe(f.read())) + "\n"
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            same = f.read() == text
        print(f"{args.out}: {'matches' if same else 'DIFFERS from'} the transcription of {args.tex}")
        return 0 if same else 1
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    n = len(json.loads(text)["published"])
    print(f"wrote {os.path.normpath(args.out)}: {n} published cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
