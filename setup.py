"""TARPO: token-wise latent/explicit routing trained with GRPO-style RL."""

from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent
# requirements.txt pins the CPU dev environment; the package itself takes any supported torch, so
# that installing it where a CUDA torch is already there (the GPU image's 2.11) keeps that torch.
TORCH = "torch>=2.11.0a0,<2.14"  # 2.11.0a0: the pre-release builds of 2.11 NVIDIA images ship
requirements = [
    TORCH if line.strip().startswith("torch==") else line.strip()
    for line in (here / "requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

setup(
    name="tarpo",
    version="0.1.0",
    license="MIT",
    description="TARPO: Token-wise latent-explicit reasoning via action-routing policy optimization",
    long_description=(here / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["tarpo", "tarpo.*"]) + ["tarpo.patches"],
    package_dir={"tarpo.patches": "patches"},  # patches/ installs as tarpo.patches, never as `patches`
    package_data={"tarpo": ["resources/*.json"]},
    install_requires=requirements,
    entry_points={"console_scripts": ["tarpo = tarpo.cli.__main__:command"]},
    # Unsloth is not an extra: its declared torchvision and xformers would replace the installed torch;
    # scripts/install_gpu.sh installs it (requirements-gpu.txt, requirements-unsloth.txt, docs/gpu-install.md)
    extras_require={
        # tensorboard: tests/test_report_to.py reads the event files of a REPORT_TO=tensorboard run
        "dev": ["pytest==9.2.0", "pytest-xdist==3.8.0", "tensorboard==2.21.0", "ruff==0.17.6"],
        # a .gguf file as MODEL (tarpo.models.gguf, tarpo.models.offline): transformers reads GGUF through it
        "gguf": ["gguf==0.19.0"],
    },
)
