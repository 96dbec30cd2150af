"""The test command (scripts/test.sh) runs the suite without the package index: the real model's preparation, the
one step that downloads, fails in one line and its tests skip (tests/test_real_model.py), instead of ending the
command before any test runs. And the set-up (scripts/setup_env.sh) stops at an install that fails."""

import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_suite_runs_with_the_package_index_unreachable(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    for name in ("requirements.txt", "requirements-gpu.txt", "requirements-unsloth.txt", "setup.py", "pytest.ini",
                 "ruff.toml", "pyproject.toml"):
        shutil.copy(os.path.join(ROOT, name), repo / name)
    shutil.copytree(os.path.join(ROOT, "scripts"), repo / "scripts")
    os.symlink(os.path.join(ROOT, ".venv"), repo / ".venv")  # the set-up environment (its stamps match the files)
    (repo / "tests" / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_NO_CACHE_DIR": "1", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2", "TEST_WORKERS": "0"}
    done = subprocess.run(["bash", "scripts/test.sh", "-q", "-p", "no:cacheprovider", "tests/test_one.py"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
    assert "test.sh: the real model is not prepared (" in done.stderr
    assert not (repo / "runs" / "cache" / "models" / "smollm2-135m").exists()


def test_the_set_up_stops_at_a_failed_install_and_writes_no_stamp(tmp_path):
    """scripts/setup_env.sh keeps pip's status through the wrapper that drops pip's location warnings (the wrapper
    once ended in ``|| true``, and a failed install went on to the import check and the stamp). The environment here
    is a stand-in whose ``python`` answers every check and whose pip fails, as with the index unreachable."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("requirements.txt", "requirements-gpu.txt", "requirements-unsloth.txt", "setup.py"):
        shutil.copy(os.path.join(ROOT, name), repo / name)
    shutil.copytree(os.path.join(ROOT, "scripts"), repo / "scripts")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\n[ "$1 $2" = "-m pip" ] && { echo "ERROR: no index reachable" >&2; exit 1; }\n'
                      'exit 0\n')
    python.chmod(0o755)
    done = subprocess.run(["bash", "scripts/setup_env.sh", "run"], cwd=repo, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "VENV": str(tmp_path / "venv")})
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "ERROR: no index reachable" in done.stdout + done.stderr
    assert not (tmp_path / "venv" / ".tarpo-env-run").exists() and "environment ready" not in done.stdout
