"""The compiled engine under the GPU machine's torch (2.11), on the CPU, and the project's declared
torch range.

scripts/setup_env.sh installs torch 2.11 into ``.venv/torch-2.11`` (scripts/setup_torch_side.sh:
PyPI's CUDA build with stub CUDA libraries); SUBSET runs there in a subprocess that puts that folder
first on PYTHONPATH, with transformers, peft, trl, ... from the project's environment at their pins.
Extend SUBSET with node ids (a file or a test name without [...] takes all its cases).
"""

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent
SIDE_VERSION = "2.11"
SITE = Path(os.environ.get("TARPO_TORCH_SIDE_SITE", ROOT / ".venv" / f"torch-{SIDE_VERSION}"))

# Both architectures, the learned and HRPO routings, one graph reused across prompt lengths, the
# step's outputs overwritten between calls as CUDA graphs do; each compares the compiled rollout
# with the eager one. The layer as a nested compile region, the attention span an unbacked size.
# About 2 min of CPU time with cold compile caches (docs/gpu-path.md).
SUBSET = (
    "tests/test_static_decode.py::test_compiled_step_has_no_graph_break_and_is_reused[qwen2]",
    "tests/test_static_decode.py::test_the_trajectory_survives_a_runtime_that_overwrites_the_steps_outputs"
    "[llama-hrpo]",
    "tests/test_functional_decoder.py::test_prefill_and_cached_steps_equal_transformers_forward[llama3-all-all]",
    "tests/test_functional_decoder.py::test_regional_forward_traces_one_layer_once",
)


def side_env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(SITE), str(ROOT)]), HF_HUB_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false")


def needs_side():
    if (SITE / "torch").is_dir():
        return
    failed = Path(f"{SITE}.failed")
    why = failed.read_text().strip() if failed.exists() else "not installed (scripts/setup_env.sh installs it)"
    pytest.skip(f"torch {SIDE_VERSION} side folder {SITE}: {why}")


def setup_kwargs():
    """What setup.py hands to setuptools.setup, without building anything."""
    got = {}
    with mock.patch("setuptools.setup", lambda **kw: got.update(kw)):
        runpy.run_path(str(ROOT / "setup.py"))
    return got


def test_subset_names_tests_that_exist():
    """Where torch 2.11 is not installed (the subset skips): where it is, the subset's own run fails on a name
    that does not exist (pytest: "ERROR: not found", exit 4), and this collection would repeat its imports."""
    if (SITE / "torch").is_dir():
        pytest.skip("test_compiled_engine_subset_passes_under_torch_2_11 runs the subset and fails on a missing name")
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *SUBSET],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    collected = [line for line in res.stdout.splitlines() if "::" in line]
    assert len(collected) >= len(SUBSET), res.stdout


def test_compiled_engine_subset_passes_under_torch_2_11():
    needs_side()
    probe = subprocess.run([sys.executable, "-c", "import torch, transformers, tarpo; "
                            "print(torch.__version__, torch.__file__, tarpo.__file__, transformers.__version__)"],
                           capture_output=True, text=True, env=side_env(), cwd="/", timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    version, torch_file, tarpo_file, _ = probe.stdout.split()
    assert version.startswith(SIDE_VERSION + ".") and torch_file.startswith(str(SITE)), probe.stdout
    assert tarpo_file.startswith(str(ROOT / "tarpo")), probe.stdout  # this checkout's code, not an install's
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *SUBSET],
                         capture_output=True, text=True, env=side_env(), cwd=ROOT, timeout=900)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    passed = re.findall(r"^PASSED (\S+)", res.stdout, re.M)
    assert len(passed) >= len(SUBSET) and not re.search(r"^(SKIPPED|XFAIL|XPASS)", res.stdout, re.M), out[-3000:]


# -- the declared versions: setup.py admits the GPU image's torch, requirements.txt pins the dev one --

def test_setup_py_admits_torch_2_11_to_2_13_with_their_pre_releases_and_requirements_txt_pins_2_13():
    kw = setup_kwargs()
    torch_req = [Requirement(r) for r in kw["install_requires"] if Requirement(r).name == "torch"]
    assert len(torch_req) == 1
    spec = torch_req[0].specifier
    # NVIDIA's images ship pre-release builds of a supported version (2.11.0a0+<commit>.nv<yy.mm>), which
    # scripts/install_gpu.sh then pins as a constraint: pip must take them
    for ok in ("2.11.0", "2.11.0+cu130", "2.12.1", "2.13.0", "2.13.0+cpu", "2.11.0a0+40ec155e58.nv25.10",
               "2.13.0rc1"):
        assert spec.contains(ok), (ok, spec)
    for bad in ("2.10.0", "2.10.0a0+git1", "2.14.0", "2.14.1", "2.14.0a0+git1"):
        assert not spec.contains(bad), (bad, spec)
    assert (SpecifierSet(kw["python_requires"]).contains("3.12.3")
            and SpecifierSet(kw["python_requires"]).contains("3.11.7"))
    pins = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert "torch==2.13.0" in pins  # the CPU dev environment's wheel (scripts/setup_env.sh)
    # every other requirement is the same pin in both
    assert sorted(r for r in kw["install_requires"] if not r.startswith("torch")) == \
        sorted(p for p in pins if not p.startswith("torch"))


def test_no_extra_names_a_torch_build():
    """Unsloth is no extra (its declared torchvision and xformers pin torch: tests/test_gpu_install.py)."""
    extras = setup_kwargs()["extras_require"]
    assert "gpu" not in extras
    for name in extras:
        named = {Requirement(r).name.lower().replace("_", "-") for r in extras[name]}
        assert not named & {"torch", "torchvision", "torchaudio", "triton", "xformers"}, (name, named)


def test_an_environment_with_torch_2_11_satisfies_the_projects_requirements():
    """What pip checks of the project's own requirements before it would fetch anything, in the
    environment with torch 2.11 first on the path (the GPU image has these versions installed)."""
    needs_side()
    reqs = setup_kwargs()["install_requires"]
    code = ("import sys; from importlib.metadata import version; from packaging.requirements import Requirement\n"
            "for r in map(Requirement, sys.argv[1:]):\n"
            "    print(r.name, version(r.name), r.specifier.contains(version(r.name), prereleases=True))")
    res = subprocess.run([sys.executable, "-c", code, *reqs], capture_output=True, text=True, env=side_env(),
                         cwd="/", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = {name: (ver, ok == "True") for name, ver, ok in (line.split() for line in res.stdout.splitlines())}
    assert got["torch"][0].startswith(SIDE_VERSION + "."), got
    assert all(ok for _, ok in got.values()), got
