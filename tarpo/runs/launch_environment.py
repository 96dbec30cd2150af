"""What a launcher run runs on, said in its first lines: the Python and why that one (``scripts/launch.sh`` chooses
it: ``$PYTHON``, the active environment, the project's ``.venv``, ``python``), torch's and Unsloth's versions
(read from the installed packages' metadata: the line comes before torch is imported), then, once torch is
imported, the device and the backend that will train.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

FROM = "TARPO_PYTHON_FROM"  # set by scripts/launch.sh: why this Python


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def python_line(env: dict) -> str:
    """The first line: Python (its path, and why it was chosen), torch, Unsloth.

    >>> python_line({FROM: "PYTHON"}).startswith(f"environment: Python {platform.python_version()} at ")
    True
    """
    why = env.get(FROM) or "the Python that started tarpo.runs.launch"
    return (f"environment: Python {platform.python_version()} at {sys.executable} ({why}); "
            f"torch {_version('torch')}; Unsloth {_version('unsloth')}")


def device_line(backend: str) -> str:
    """The second: the device that trains (CUDA's devices, or the CPU) and the backend (``hf`` or ``unsloth``,
    :func:`tarpo.models.loading.resolve_backend`'s choice)."""
    import torch
    if torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        device = f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} x {', '.join(names)}"
    else:
        device = f"the CPU ({os.cpu_count()} cores; torch sees no CUDA device)"
    why = {"unsloth": "CUDA and Unsloth are here", "hf": "transformers + PEFT"}[backend]
    return f"device: {device}; backend: {backend} ({why})"
