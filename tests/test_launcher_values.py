"""The launchers show the values a researcher edits (tarpo/runs/launcher_values.py): each run_<data>.sh holds the
paper's settings for its data set as shell variables with their values written in, generated from the presets (one
owner); an edited value changes the run, the environment still wins, and a run first prints what it uses and where
each value came from, before torch is imported."""

import json
import os
import re
import subprocess
import sys

import pytest

from test_launch import ROOT, dry_run

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import write_launchers  # noqa: E402

WRITTEN = re.compile(r"^([A-Z][A-Z0-9_]*)=\$\{\1:-([^}$]+)\}", re.M)  # a variable with its value written in


def test_the_launchers_and_their_values_file_hold_what_the_presets_give():
    """scripts/write_launchers.py --check: what each launcher's block and tarpo/resources/launcher_values.json hold
    is what the presets give (a preset changed alone, or a launcher edited in the repository, fails here)."""
    stale = [os.path.relpath(p, ROOT) for p, text in write_launchers.expected().items() if open(p).read() != text]
    assert stale == [], f"run python scripts/write_launchers.py: {stale}"


def test_a_changed_preset_would_be_found(monkeypatch):
    from tarpo.runs import presets

    monkeypatch.setitem(presets.DATASETS, "math", {**presets.DATASETS["math"], "num_generations": 16})
    stale = [os.path.relpath(p, ROOT) for p, text in write_launchers.expected().items() if open(p).read() != text]
    assert stale == ["tarpo/resources/launcher_values.json", "run_math.sh"]


def test_the_writer_refuses_to_overwrite_a_block_edited_by_hand(tmp_path, monkeypatch, capsys):
    """A researcher's edited value survives ``write_launchers.py`` (one line naming the file, nothing written, exit
    1); ``--force`` overwrites it; a block the writer wrote is rewritten when a preset changes."""
    from tarpo.runs import presets

    for name in ("run_gsm8k.sh", "run_math.sh", "run_dapo.sh"):
        (tmp_path / name).write_text(open(os.path.join(ROOT, name)).read())
    resource = tmp_path / "launcher_values.json"
    resource.write_text(open(write_launchers.RESOURCE).read())
    monkeypatch.setattr(write_launchers, "ROOT", str(tmp_path))
    monkeypatch.setattr(write_launchers, "RESOURCE", str(resource))
    math = tmp_path / "run_math.sh"
    edited = math.read_text().replace("BETA=${BETA:-0.005}", "BETA=${BETA:-0.01}")
    assert edited != math.read_text()
    math.write_text(edited)
    monkeypatch.setitem(presets.DATASETS, "gsm8k", {**presets.DATASETS["gsm8k"], "num_generations": 16})
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert write_launchers.main([]) == 1
    assert "run_math.sh: the block of settings was edited by hand; nothing written" in capsys.readouterr().err
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before  # not even the unedited launcher
    assert write_launchers.main(["--force"]) == 0
    assert "BETA=${BETA:-0.005}" in math.read_text() and "GROUP_SIZE=${GROUP_SIZE:-16}" in (
        tmp_path / "run_gsm8k.sh").read_text()
    monkeypatch.setitem(presets.DATASETS, "gsm8k", {**presets.DATASETS["gsm8k"], "num_generations": 4})
    assert write_launchers.main([]) == 0  # written by the writer: rewritten without --force
    assert "GROUP_SIZE=${GROUP_SIZE:-4}" in (tmp_path / "run_gsm8k.sh").read_text()


@pytest.mark.parametrize("dataset", ["gsm8k", "math", "dapo"])
def test_each_launcher_writes_the_values_a_dry_run_resolves(dataset):
    """At least 20 variables with their values written in, among them BETA, LR, GROUP_SIZE, SOFT_TOP_K, TEMPERATURE and
    ACTION_BIAS, each what DRY_RUN=1 resolves for the default model; the model-dependent ones per model preset."""
    from tarpo.runs.launcher_values import same
    from tarpo.runs.launch_variables import VARIABLES
    from tarpo.runs.presets import MODELS, resolve

    text = open(os.path.join(ROOT, f"run_{dataset}.sh")).read()
    assert len(re.findall(r"=\$\{[A-Z_]*:-[^}]", text)) >= 20  # the grep
    lines = text[text.index("esac"):]  # the default model's values (the case block holds the other models')
    written = dict(WRITTEN.findall(lines))
    assert {"BETA", "LR", "GROUP_SIZE", "SOFT_TOP_K", "TEMPERATURE", "ACTION_BIAS"} <= set(written)
    trainer = dry_run(f"run_{dataset}.sh")["trainer"]
    for name, value in written.items():
        if name in VARIABLES:
            field = VARIABLES[name][0]
            assert same(name, value, as_text(trainer[field])), (name, value, trainer[field])
    case = text[text.index("case "):text.index("esac")]
    for model in MODELS:
        row = next(line for line in case.splitlines() if re.search(rf"(^  |\|){re.escape(model)}(\||\))", line))
        values = {**{n: written[n] for n in ("ACTION_BIAS", "LR", "ROUTER_LR")}, **dict(WRITTEN.findall(
            row.split(") ", 1)[1].replace(" ", "\n")))}
        t = resolve(dataset, {"MODEL": model}).trainer  # (the larger presets' dry runs ask for several GPUs)
        assert same("ACTION_BIAS", values["ACTION_BIAS"], as_text(t["action_bias"]))
        assert same("LR", values["LR"], str(t["learning_rate"])) and same("ROUTER_LR", values["ROUTER_LR"],
                                                                          str(t["router_lr"]))


def as_text(value) -> str:
    """A resolved value as a variable would be set to it."""
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def edited_copy(tmp_path, dataset, old, new):
    """``run_<dataset>.sh`` copied into ``tmp_path`` with ``old`` replaced by ``new``, beside scripts/launch.sh."""
    text = open(os.path.join(ROOT, f"run_{dataset}.sh")).read()
    assert old in text
    (tmp_path / "scripts").mkdir(exist_ok=True)
    os.symlink(os.path.join(ROOT, "scripts", "launch.sh"), tmp_path / "scripts" / "launch.sh")
    (tmp_path / f"run_{dataset}.sh").write_text(text.replace(old, new))
    return str(tmp_path / f"run_{dataset}.sh")


def start(script, **env):
    from tarpo.runs.launch_variables import SETTINGS, VARIABLES
    clean = {k: v for k, v in os.environ.items() if k not in {*VARIABLES, *SETTINGS}}
    return subprocess.Popen(["bash", script], env={**clean, "HF_HUB_OFFLINE": "1", "PYTHON": sys.executable,
                                                   "PYTHONUNBUFFERED": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_an_edited_launcher_resolves_the_edited_value_and_says_where_each_value_came_from(tmp_path):
    """A copy of each launcher with BETA edited, SEED set in the environment and LR in both (the environment wins):
    DRY_RUN=1 resolves BETA from the file, SEED and LR from the environment, and first prints the table, which
    names the three sources; for run_math.sh the table comes before torch is imported."""
    runs = {}
    for dataset, beta in (("gsm8k", "0.005"), ("math", "0.005"), ("dapo", "0.005")):
        folder = tmp_path / dataset
        folder.mkdir()
        script = edited_copy(folder, dataset, f"BETA=${{BETA:-{beta}}}", "BETA=${BETA:-0.02}")
        runs[dataset] = start(script, DRY_RUN="1", SEED="3", LR="1e-06",
                              **({"PYTHONPROFILEIMPORTTIME": "1"} if dataset == "math" else {}))
    for dataset, proc in runs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
        lines = [line for line in out.splitlines() if not line.startswith("import time:")]
        t = json.loads(lines[-1])["trainer"]
        assert (t["beta"], t["seed"], t["learning_rate"]) == (0.02, 3, 1e-6), dataset
        table = lines[:lines.index("launcher variables (scripts/launch.sh lists all):") + 8]
        assert any(re.match(rf"  BETA +\= 0\.02 +run_{dataset}\.sh \(paper: 0\.005\)$", line) for line in table), table
        assert any(re.match(r"  SEED +\= 3 +environment$", line) for line in table), table
        assert any(re.match(r"  LR +\= 1e-06 +environment$", line) for line in table), table
        assert any(line.startswith(f"  paper ({dataset}, qwen2.5-3b): MODEL=qwen2.5-3b") for line in table), table
        if dataset == "math":  # the table is printed before torch's first module is imported
            first_torch = next(i for i, line in enumerate(out.splitlines()) if re.search(r"\| +torch(\.|$)", line))
            assert out.splitlines().index("launcher variables (scripts/launch.sh lists all):") < first_torch


def test_the_run_time_table_imports_neither_torch_nor_trl():
    """What a run prints at start-up (launcher_values.table of its sources) comes from the resource file, without
    torch or TRL; the writer that reads the presets lives apart (tarpo.runs.launcher_writer)."""
    code = ("import sys; import tarpo.runs.launcher_values as v; "
            "env = {'MODEL': 'qwen2.5-3b', 'LR': '1e-6', 'BETA': '0', 'TARPO_FROM_ENVIRONMENT': 'LR'}; "
            "text = v.table(v.sources('gsm8k', env)); assert 'run_gsm8k.sh' in text and 'environment' in text, text; "
            "v.render('LORA_TARGETS', ['q_proj', 'k_proj', 'v_proj', 'o_proj']); "
            "heavy = {'torch', 'trl', 'transformers'} & set(sys.modules); assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
