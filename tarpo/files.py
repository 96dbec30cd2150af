"""Atomic file writes: a failed or killed run never leaves a half-written output file."""

from __future__ import annotations

import json
import os
import tempfile


def default_mode() -> int:
    """The mode ``open()`` gives a new file under the current umask (``mkstemp`` gives 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_text_atomic(path: str, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place; the file
    gets the same mode as any other file the run writes (the user's umask)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        os.fchmod(fd, default_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json_atomic(path: str, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")
