"""Write the paper's settings into the launchers: the block of shell variables of run_gsm8k.sh, run_math.sh and
run_dapo.sh (between "# >>> the paper's settings" and "# <<< the paper's settings") and
tarpo/resources/launcher_values.json, from tarpo/runs/presets.py, their one owner (tarpo.runs.launcher_values).

    python scripts/write_launchers.py          # rewrite them
    python scripts/write_launchers.py --check  # exit 1 naming each file that differs from what the presets give
    python scripts/write_launchers.py --force  # rewrite them, also a block edited by hand

A block the writer did not write as it is (a researcher's edited value: its recorded digest is not that of its
lines) is not overwritten without ``--force``: the command names the file and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tarpo.atomic_files import write_text_atomic  # noqa: E402
from tarpo.runs.launcher_values import LAUNCHED_DATA_SETS, RESOURCE  # noqa: E402
from tarpo.runs.launcher_writer import edited_by_hand, generated_values, written  # noqa: E402


def expected() -> dict[str, str]:
    """path -> the text the presets give it."""
    values = generated_values()
    out = {RESOURCE: json.dumps(values, indent=1) + "\n"}
    for dataset in LAUNCHED_DATA_SETS:
        path = os.path.join(ROOT, f"run_{dataset}.sh")
        out[path] = written(open(path).read(), dataset, values)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--force", action="store_true", help="overwrite a block edited by hand")
    args = ap.parse_args(argv)
    texts = expected()
    current = {path: open(path).read() if os.path.exists(path) else None for path in texts}
    stale = [path for path, text in texts.items() if current[path] != text]
    names = ", ".join(os.path.relpath(p, ROOT) for p in stale)
    if args.check:
        if stale:
            print(f"differ from tarpo/runs/presets.py: {names} (python scripts/write_launchers.py)")
            return 1
        print("the launchers hold the presets' values")
        return 0
    edited = [p for p in stale if p != RESOURCE and current[p] is not None and edited_by_hand(current[p])]
    if edited and not args.force:  # before anything is written
        print(f"write_launchers: {', '.join(os.path.relpath(p, ROOT) for p in edited)}: the block of settings was "
              "edited by hand; nothing written (--force overwrites it with the presets' values)", file=sys.stderr)
        return 1
    for path in stale:
        mode = os.stat(path).st_mode if current[path] is not None else None
        write_text_atomic(path, texts[path])
        if mode is not None:
            os.chmod(path, mode)  # a launcher stays executable
    print(f"rewrote {names}" if stale else "the launchers hold the presets' values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
