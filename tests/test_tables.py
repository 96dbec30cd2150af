import json
import os

import pytest

from tarpo.cli import main as cli
from tarpo.tables import build, latex, load_results, paper_tables

from test_eval import DATA, eval_args, needs_data, tiny  # noqa: F401  (module fixture)


def write_result(folder, system, model, task, pass1, subsets=None, units=100.0):
    res = {"system": system, "model_name": model, "task": task, "subsets": subsets or {},
           "metrics": {"pass@1": pass1, "accuracy_ci95": 0.01, "units": units, "maj@32": pass1, "accuracy_sd": 0.2}}
    with open(os.path.join(folder, f"{system}-{model}-{task}.results.json".replace(" ", "_")), "w") as f:
        json.dump(res, f)


def test_table1_cells_from_hand_results(tmp_path):
    model = "Qwen2.5-3B-Instruct"
    values = {"gsm8k": 0.8, "math": 0.6, "amc23": 0.4, "olympiadbench": 0.2}
    for task, v in values.items():
        write_result(tmp_path, "TARPO", model, task, v,
                     subsets={"math500": {"pass@1": 0.5, "accuracy_ci95": 0.02}} if task == "math" else None)
    title, header, rows = build("1", load_results(str(tmp_path)))
    assert header == ["Model", "System", "GSM8K", "MATH", "MATH500", "AMC23", "OlympiadBench", "Avg"]
    row = next(r for r in rows if r[:2] == [model, "TARPO"])
    # MATH500 comes from the MATH run's subset; Avg = mean of the five = 50.00; paper Avg 53.61 (README)
    assert row[2:] == ["80.00 / –", "60.00 / –", "50.00 / –", "40.00 / –", "20.00 / –", "50.00 / 53.61 (-3.61)"]
    cot = next(r for r in rows if r[:2] == [model, "CoT"])
    assert cot[2:] == ["–"] * 5 + ["– / 48.89"]  # declared row, no results of ours
    assert len(rows) == 3 * 8  # every declared model x system, nothing extra


def test_missing_column_leaves_the_average_empty_and_other_models_are_appended(tmp_path):
    write_result(tmp_path, "GRPO", "tiny", "gsm8k", 0.25)
    write_result(tmp_path, "my variant", "Qwen2.5-7B-Instruct", "gsm8k", 0.5)
    _, _, rows = build("1", load_results(str(tmp_path)))
    assert ["tiny", "GRPO", "25.00 / –", "–", "–", "–", "–", "–"] in rows
    assert ["Qwen2.5-7B-Instruct", "my variant", "50.00 / –", "–", "–", "–", "–", "–"] in rows
    _, _, llama = build("2", load_results(str(tmp_path)))
    assert all(r[0] == "Llama-3.1-8B-Instruct" for r in llama)


def test_ci_table_and_units_and_latex(tmp_path):
    write_result(tmp_path, "TARPO", "Qwen2.5-3B-Instruct", "gsm8k", 0.5)
    for task in ("gpqa_diamond", "arc_challenge", "humaneval"):
        write_result(tmp_path, "TARPO", "Qwen2.5-3B-Instruct", task, 0.5, units=300.0)
    results = load_results(str(tmp_path))
    _, _, rows8 = build("8", results)
    assert next(r for r in rows8 if r[1] == "TARPO" and r[0] == "Qwen2.5-3B-Instruct")[2] == "50.00 ± 1.00 / –"
    _, header4, rows4 = build("4", results)
    row = next(r for r in rows4 if r[1] == "TARPO")
    assert row[header4.index("Avg")] == "50.00 / 55.35 (-5.35)" and row[header4.index("#Tok")] == "300.00 / 337.90 (-37.90)"
    tex = latex(*build("4", results))
    assert r"\begin{tabular}" in tex and r"\#Tok" in tex and "55.35 (-5.35)" in tex and "–" not in tex


def test_every_published_number_names_its_table_row_and_source():
    spec = paper_tables()
    for p in spec["published"]:
        table = spec["tables"][p["table"]]
        assert p["column"] in [c["label"] for c in table["columns"]] and p["model"] in table["models"]
        assert p["system"] in table["systems"] and p["source"]


def test_duplicate_results_and_bad_table_numbers_are_errors(tmp_path, capsys):
    write_result(tmp_path, "TARPO", "m", "gsm8k", 0.5)
    os.makedirs(tmp_path / "again")
    write_result(tmp_path / "again", "TARPO", "m", "gsm8k", 0.6)
    with pytest.raises(ValueError, match="both hold"):
        load_results(str(tmp_path))
    assert cli(["table", str(tmp_path), "--tables", "9"]) == 2
    assert "--tables: no table 9" in capsys.readouterr().err


@needs_data
def test_table_renders_eval_results_of_a_tiny_model(tiny, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "eval"
    assert cli(eval_args(tiny, out, "--tasks", "gsm8k,math", "--limit", "20", "--n", "2",
                         "--model-name", "Qwen2.5-3B-Instruct", "--system", "TARPO")) == 0
    capsys.readouterr()
    assert cli(["table", str(out), "--tables", "1", "--out", str(tmp_path / "tables")]) == 0
    md = (tmp_path / "tables" / "tables.md").read_text()
    res = {t: json.load(open(out / f"{t}.results.json")) for t in ("gsm8k", "math")}
    g, m = (100 * res[t]["metrics"]["pass@1"] for t in ("gsm8k", "math"))
    sub = 100 * res["math"]["subsets"]["math500"]["pass@1"]
    assert f"| Qwen2.5-3B-Instruct | TARPO | {g:.2f} / – | {m:.2f} / – | {sub:.2f} / – | – | – | – / 53.61 |" in md
    assert (tmp_path / "tables" / "tables.tex").read_text().count(r"\begin{table}") == 1
