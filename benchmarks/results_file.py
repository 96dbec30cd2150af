"""The benchmarks' results file: a JSON object that each benchmark merges its figures into, under its own key."""

from __future__ import annotations

import json
import os


def record(path: str, key: str, value) -> None:
    """Merge ``{key: value}`` into the JSON file ``path`` (replaced atomically; no tarpo import: it records a
    failed install too)."""
    merged = json.load(open(path)) if os.path.exists(path) else {}
    merged[key] = value
    with open(path + ".tmp", "w") as f:
        json.dump(merged, f, indent=1)
    os.replace(path + ".tmp", path)
