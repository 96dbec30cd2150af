"""The GPU install keeps the installed torch (scripts/install_gpu.sh, docs/gpu-install.md).

unsloth declares ``torchvision`` and ``xformers``; every release of either is built for one torch, so letting
pip resolve unsloth's dependencies over the GPU image's torch 2.11 replaces that torch (a dry run chose torch
2.12.1 through torchvision 0.27.1, docs/gpu-install.md) or fails offline. These tests read the install as it
is written: the commands the script runs (a stand-in ``python`` records them), and which packages those
commands can pull, walked through the declared dependencies of the pinned releases (this environment's
metadata, and the pinned unsloth wheels in ``.venv/unsloth-cpu``). docs/gpu-install.md has pip's own dry run.
"""

import os
import re
import subprocess
from importlib.metadata import PackageNotFoundError, distribution, distributions

import pytest
from packaging.requirements import Requirement

from test_unsloth_cpu import SITE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_BOUND = {"torchvision", "torchaudio", "xformers"}  # each release built for one torch
# what unsloth / unsloth_zoo declare and the install leaves out on purpose (requirements-gpu.txt says why)
LEFT_OUT = {"torch", "triton", "torchvision", "xformers", "tyro", "diffusers", "hf-transfer", "msgspec", "structlog",
            "typer", "click", "rich", "pydantic", "nest-asyncio", "wheel", "pyyaml"}
GPU_MACHINE = {"sys_platform": "linux", "platform_machine": "x86_64", "platform_system": "Linux",
               "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
               "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}

needs_unsloth = pytest.mark.skipif(not os.path.isdir(os.path.join(SITE, "unsloth")),
                                   reason=f"the pinned unsloth wheels are not unpacked in {SITE} "
                                          "(scripts/setup_env.sh)")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_lines(path: str) -> list[str]:
    return [line.split("#")[0].strip() for line in open(os.path.join(ROOT, path)) if line.split("#")[0].strip()]


def unsloth_distributions() -> dict:
    return {norm(d.metadata["Name"]): d for d in distributions(path=[SITE]) if norm(d.metadata["Name"]) in
            ("unsloth", "unsloth-zoo")}


def declared(name: str):
    """The requirements a distribution declares on the GPU machine (no extras): the pinned unsloth wheels, else
    this environment's installed metadata; None when neither has it."""
    dist = unsloth_distributions().get(norm(name))
    if dist is None:
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            return None
    reqs = [Requirement(r) for r in dist.requires or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(GPU_MACHINE)]


def pulled(requirements, no_deps=()) -> set[str]:
    """Every package name that resolving ``requirements`` can install, following declared dependencies (not
    those of the names in ``no_deps``, installed with ``--no-deps``)."""
    seen, todo = set(), [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = norm(req.name)
        if name in seen:
            continue
        seen.add(name)
        if name in {norm(n) for n in no_deps}:
            continue
        assert not req.extras, f"{req}: extras are not followed"  # none of the walked requirements names one
        todo += declared(req.name) or []  # markers evaluated for the GPU machine, no extras
    return seen


def run_script(tmp_path, torch_version="2.11.0+cu130", managed=False, **env):
    """``scripts/install_gpu.sh`` with a stand-in python that has ``torch_version`` installed (and is externally
    managed, PEP 668, if ``managed``) and records each pip command it is given in ``tmp_path/calls``, a constraint
    file's content in place of its path."""
    log, fake = tmp_path / "calls", tmp_path / "python"
    log.write_text("")
    fake.write_text(f"""#!/usr/bin/env bash
if [ "$1" = "-c" ]; then echo {torch_version} {int(managed)}; exit 0; fi
args=()
while [ $# -gt 0 ]; do
  if [ "$1" = "-c" ]; then args+=("-c" "$(cat "$2")"); shift 2; else args+=("$1"); shift; fi
done
printf '%s\\t' "${{args[@]}}" >> {log}; echo >> {log}
""")
    fake.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if k != "PIP_BREAK_SYSTEM_PACKAGES"}
    res = subprocess.run(["bash", os.path.join(ROOT, "scripts", "install_gpu.sh")], capture_output=True, text=True,
                         env=dict(clean, PYTHON=str(fake), **env), timeout=60)
    return res, [line.rstrip("\t").split("\t") for line in log.read_text().splitlines()]


def script_commands(tmp_path, torch_version="2.11.0+cu130") -> list[list[str]]:
    """The pip commands ``scripts/install_gpu.sh`` runs over an installed ``torch_version``."""
    res, calls = run_script(tmp_path, torch_version)
    assert res.returncode == 0, res.stderr
    return calls


def test_a_pre_release_torch_of_the_image_is_kept(tmp_path):
    """NVIDIA's images ship torch as a pre-release build: the script pins it, and setup.py admits it
    (tests/test_torch_side.py), so pip can satisfy both."""
    first, _ = script_commands(tmp_path, "2.11.0a0+40ec155e58.nv25.10")
    assert first[first.index("-c") + 1] == "torch==2.11.0a0+40ec155e58.nv25.10"


def test_an_externally_managed_python_is_refused_in_one_line_that_says_what_to_do(tmp_path):
    """PEP 668: pip refuses to install into a system Python marked EXTERNALLY-MANAGED; the script says so
    before running pip, and gives the venv that keeps the image's torch visible."""
    res, calls = run_script(tmp_path, managed=True)
    assert res.returncode == 2 and calls == [], (res.stdout, calls)
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "externally managed (PEP 668)" in res.stderr and "venv --system-site-packages" in res.stderr
    res, calls = run_script(tmp_path, managed=True, PIP_BREAK_SYSTEM_PACKAGES="1")  # the user's own choice
    assert res.returncode == 0 and len(calls) == 2, res.stderr


def test_the_readme_gives_the_install_that_keeps_torch():
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme[readme.index("## One GPU"):]
    section = section[:section.index("\n## ", 3)]
    assert "bash scripts/install_gpu.sh" in section
    for path in ("README.md", "requirements.txt", "docs/gpu-path.md", "tarpo/models/loading.py"):
        assert "[gpu]" not in open(os.path.join(ROOT, path)).read(), path  # the old extra, which replaced torch


def test_the_script_keeps_the_installed_torch_and_installs_unsloth_without_its_declared_dependencies(tmp_path):
    first, second = script_commands(tmp_path)
    assert first[:3] == ["-m", "pip", "install"] and second[:3] == ["-m", "pip", "install"]
    constraint = first[first.index("-c") + 1]
    assert constraint == "torch==2.11.0+cu130"
    assert "-e" in first and "requirements-gpu.txt" in first
    assert second[3:] == ["--no-deps", "-r", "requirements-unsloth.txt"]


@needs_unsloth
def test_the_install_pulls_no_package_built_for_another_torch():
    """The first command's requirements (the project's and requirements-gpu.txt) reach no torchvision,
    torchaudio or xformers through any declared dependency; the old ``pip install -e '.[gpu]'`` reached
    both through unsloth (so this check sees the defect)."""
    from test_torch_side import setup_kwargs

    project = setup_kwargs()["install_requires"]
    got = pulled(project + requirement_lines("requirements-gpu.txt"))
    assert not got & TORCH_BOUND, got & TORCH_BOUND
    assert "torch" in got  # the installed one, held by the constraint
    before = pulled(project + ["unsloth==2026.10.7", "unsloth_zoo==2026.10.7"])  # what '.[gpu]' resolved
    assert before & TORCH_BOUND == {"torchvision", "xformers"}


@needs_unsloth
def test_every_dependency_unsloth_declares_is_installed_or_left_out_on_purpose():
    gpu = {norm(Requirement(r).name) for r in requirement_lines("requirements-gpu.txt")}
    project = {norm(Requirement(r).name) for r in requirement_lines("requirements.txt")}
    header = open(os.path.join(ROOT, "requirements-gpu.txt")).read().split("\n\n")[0].lower()
    for name in ("unsloth", "unsloth_zoo"):
        for req in declared(name):
            n = norm(req.name)
            if n in ("unsloth", "unsloth-zoo"):
                continue
            assert n in gpu or n in project or n in LEFT_OUT, f"{name} declares {req}: install it or leave it out"
    assert not gpu & LEFT_OUT
    assert all(n.replace("-", "_") in header.replace("-", "_") for n in LEFT_OUT), "requirements-gpu.txt says why"


def test_the_unsloth_pins_are_the_ones_the_patches_are_written_against():
    from tarpo.patches.versions import EXPECTED_VERSIONS

    pins = dict(line.split("==") for line in requirement_lines("requirements-unsloth.txt"))
    assert pins == EXPECTED_VERSIONS
    if os.path.isdir(SITE):
        assert {n.replace("-", "_"): d.version for n, d in unsloth_distributions().items()} == EXPECTED_VERSIONS
