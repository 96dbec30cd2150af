"""A launcher run's first lines name what it runs on (tarpo/runs/launch_environment.py): the Python and why that
one, torch and Unsloth, then the device and the backend; an active environment is taken over the project's .venv,
and $PYTHON over both (scripts/launch.sh)."""

import os
import subprocess
import sys

import torch

from test_launch import ROOT


def dry_run(tmp_path, **env):
    from tarpo.runs.launch_variables import SETTINGS, VARIABLES
    drop = {*VARIABLES, *SETTINGS, "PYTHON", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "TARPO_PYTHON_FROM"}
    clean = {k: v for k, v in os.environ.items() if k not in drop}
    out = subprocess.run(["bash", os.path.join(ROOT, "run_gsm8k.sh")], capture_output=True, text=True, timeout=300,
                         env={**clean, "HF_HUB_OFFLINE": "1", "DRY_RUN": "1", "OUT_DIR": str(tmp_path / "runs"),
                              **env})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout.splitlines()


def active_environment(tmp_path):
    """A folder as an activated venv has it: ``bin/python`` (here a wrapper that leaves a mark, then runs this
    Python)."""
    folder = tmp_path / "env"
    (folder / "bin").mkdir(parents=True)
    python = folder / "bin" / "python"
    python.write_text(f"#!/bin/sh\ntouch {tmp_path / 'used'}\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return folder


def test_the_first_lines_name_python_torch_the_device_and_the_backend(tmp_path):
    venv = active_environment(tmp_path)
    lines = dry_run(tmp_path, PYTHON=sys.executable, VIRTUAL_ENV=str(venv))
    assert lines[0].startswith(f"environment: Python {sys.version.split()[0]} at {sys.executable} (PYTHON); "
                               f"torch {torch.__version__}; Unsloth "), lines[0]
    assert not (tmp_path / "used").exists()  # $PYTHON wins over the active environment
    device = [line for line in lines[:60] if line.startswith("device: ")]
    assert device == ["device: the CPU (%d cores; torch sees no CUDA device); backend: hf (transformers + PEFT)"
                      % os.cpu_count()], lines[:60]


def test_the_active_environment_is_taken_over_the_projects_venv(tmp_path):
    venv = active_environment(tmp_path)
    lines = dry_run(tmp_path, VIRTUAL_ENV=str(venv))
    assert (tmp_path / "used").exists()
    assert f"(the active environment, {venv}); torch " in lines[0], lines[0]


def test_conda_base_which_every_shell_activates_is_not_taken_over_the_projects_venv(tmp_path):
    conda = active_environment(tmp_path)
    lines = dry_run(tmp_path, CONDA_PREFIX=str(conda), CONDA_DEFAULT_ENV="base")
    assert not (tmp_path / "used").exists() and "(the project's .venv: no environment is active" in lines[0]
    lines = dry_run(tmp_path, CONDA_PREFIX=str(conda), CONDA_DEFAULT_ENV="tarpo")
    assert (tmp_path / "used").exists() and f"(the active conda environment, {conda}); torch " in lines[0]
