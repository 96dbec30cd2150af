"""Atomic file writes: a failed or killed run never leaves a half-written output file or folder.

Every file the project publishes goes through :func:`atomic_path` (written under a temporary name beside
it, then renamed into place); a folder through :func:`publish_folder`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile


def default_mode() -> int:
    """The mode ``open()`` gives a new file under the current umask (``mkstemp`` gives 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(path: str):
    """A temporary path beside ``path`` (same suffix, so that writers that read it, matplotlib's, pick the
    format) to write in; renamed to ``path`` when the block ends, removed if it raises. The file gets the
    mode of any other file the run writes (the user's umask)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    os.fchmod(fd, default_mode())
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def write_json_atomic(path: str, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


def write_jsonl_atomic(path: str, rows) -> None:
    """One JSON object a line."""
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def fsync(path: str) -> None:
    """Flush a file or folder to the disk (a folder that cannot be flushed is skipped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder
        pass
    finally:
        os.close(fd)


def publish_folder(staged: str, final: str) -> None:
    """Make the complete folder ``staged`` appear as ``final`` at once (replacing what is there)."""
    for root, _, names in os.walk(staged):
        for name in names:
            fsync(os.path.join(root, name))
        fsync(root)
    parent, name = os.path.split(os.path.abspath(final))
    old = None
    if os.path.lexists(final):  # e.g. an incomplete checkpoint-N of an older version: set it aside first
        old = os.path.join(parent, f".{name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staged, final)
    fsync(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_writable_folder(path: str, label: str) -> None:
    """``path`` is a folder this process can write into, or one it can create: checked before any model loads
    and before anything is written (an existing folder gets a probe file). Raises ``ValueError`` beginning
    with ``label`` (the flag or variable that named ``path``, e.g. ``--out runs/x`` or ``OUT_DIR=runs``)."""
    parent = os.path.abspath(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{label}: {parent} exists and is not a folder")
    try:
        if parent == os.path.abspath(path):
            with tempfile.TemporaryFile(dir=parent):
                pass
        elif not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(f"cannot create a folder in {parent}")
    except OSError as exc:
        raise ValueError(f"{label}: not writable ({exc.strerror or exc})") from None
