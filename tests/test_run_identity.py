"""A run folder knows what it is (tarpo/runs/run_identity.py): a launch into a folder made with other settings
or other data is refused before anything loads, naming each difference and the two ways out, and leaves the
folder's files as they were; the same settings resume or say the run is finished."""

import hashlib
import re
import json
import os

import pytest

from test_launch import launch, tiny_model_folder


def tree_digest(root) -> dict:
    """Every file under ``root`` and the sha256 of its bytes."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def gsm8k_rows(path, offset=0):
    path.write_text("".join(json.dumps({"question": f"What is {i} + {offset}?", "answer": f"#### {i + offset}"})
                            + "\n" for i in range(8)))
    return str(path)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A tiny GSM8K run trained to its end (one step), and the settings it was launched with."""
    root = tmp_path_factory.mktemp("identity")
    env = dict(MODEL=tiny_model_folder(root / "tiny"), DATA_PATH=gsm8k_rows(root / "a.jsonl"),
               OUT_DIR=str(root / "runs"), RUN_NAME="run", BATCH="4", GROUP_SIZE="2", MAX_STEPS="1",
               MAX_PROMPT_LENGTH="320", MAX_COMPLETION_LENGTH="4", LORA_R="4", LORA_ALPHA="8")
    res = launch("run_gsm8k.sh", timeout=300, **env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return root, env


@pytest.mark.parametrize("change, named", [
    ({"LORA_R": "8"}, ["LORA_R=8 (the run folder's: 4)"]),
    ({"DATA_PATH": "b.jsonl"}, ["DATA_PATH=", "DATA_PATH (contents) differ"]),
    ({"SEED": "3", "LR": "1e-4"}, ["SEED=3 (the run folder's: 0)", "LR=0.0001 (the run folder's: 5e-06)"]),
])
def test_a_launch_into_a_finished_run_with_other_settings_is_refused_and_changes_nothing(
        finished, change, named, monkeypatch, capsys):
    from tarpo.runs import launch as launcher
    from tarpo.runs.launch_variables import SETTINGS, VARIABLES

    root, env = finished
    if "DATA_PATH" in change:  # the same file name in another folder: other rows
        os.makedirs(root / "other", exist_ok=True)
        change = {"DATA_PATH": gsm8k_rows(root / "other" / "a.jsonl", offset=1)}
    before = tree_digest(root / "runs" / "run")
    for name in (*VARIABLES, *SETTINGS):  # the launcher's main() in this process: only these settings
        monkeypatch.delenv(name, raising=False)
    for name, value in {**env, **change}.items():
        monkeypatch.setenv(name, value)
    assert launcher.main(["gsm8k"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tarpo launch: error: OUT_DIR/RUN_NAME"), err
    assert all(n in lines[0] for n in named), lines[0]
    assert "another RUN_NAME or OUT_DIR" in lines[0] and "the same settings" in lines[0]
    assert "memory plan" not in out  # refused before planning, loading or writing
    assert tree_digest(root / "runs" / "run") == before


def test_the_same_settings_find_the_run_finished(finished):
    root, env = finished
    before = tree_digest(root / "runs" / "run")
    res = launch("run_gsm8k.sh", **env)
    assert res.returncode == 0 and "run already finished at step 1" in res.stdout, res.stdout + res.stderr
    assert tree_digest(root / "runs" / "run") == before


def test_a_launcher_edited_after_the_run_is_refused_naming_the_edited_variable(finished, tmp_path):
    """run_gsm8k.sh copied with BETA edited in its block (tarpo/runs/launcher_values.py), launched into the finished
    run's folder: refused before anything loads, naming BETA with both values."""
    from test_launcher_values import edited_copy, start

    root, env = finished
    before = tree_digest(root / "runs" / "run")
    proc = start(edited_copy(tmp_path, "gsm8k", "BETA=${BETA:-0.005}", "BETA=${BETA:-0.01}"), **env)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "BETA=0.01 (the run folder's: 0.005)" in out, out[-3000:]
    assert re.search(r"  BETA += 0\.01 +run_gsm8k\.sh \(paper: 0\.005\)", out), out[-3000:]
    assert "memory plan" not in out
    assert tree_digest(root / "runs" / "run") == before
