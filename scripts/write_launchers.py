"""Write the paper's settings into the launchers: the block of shell variables of run_gsm8k.sh, run_math.sh and
run_dapo.sh (between "# >>> the paper's settings" and "# <<< the paper's settings") and
tarpo/resources/launcher_values.json, from tarpo/runs/presets.py, their one owner (tarpo.runs.launcher_values).

    python scripts/write_launchers.py          # rewrite them
    python scripts/write_launchers.py --check  # exit 1 naming each file that differs from what the presets give
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tarpo.atomic_files import write_text_atomic  # noqa: E402
from tarpo.runs.launcher_values import LAUNCHED_DATA_SETS, RESOURCE, generated_values, written  # noqa: E402


def expected() -> dict[str, str]:
    """path -> the text the presets give it."""
    values = generated_values()
    out = {RESOURCE: json.dumps(values, indent=1) + "\n"}
    for dataset in LAUNCHED_DATA_SETS:
        path = os.path.join(ROOT, f"run_{dataset}.sh")
        out[path] = written(open(path).read(), dataset, values)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    stale = []
    for path, text in expected().items():
        current = open(path).read() if os.path.exists(path) else None
        if current != text:
            stale.append(os.path.relpath(path, ROOT))
            if not args.check:
                mode = os.stat(path).st_mode if os.path.exists(path) else None
                write_text_atomic(path, text)
                if mode is not None:
                    os.chmod(path, mode)  # a launcher stays executable
    if args.check and stale:
        print(f"differ from tarpo/runs/presets.py: {', '.join(stale)} (python scripts/write_launchers.py)")
        return 1
    print(("rewrote " + ", ".join(stale)) if stale else "the launchers hold the presets' values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
