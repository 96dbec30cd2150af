"""Records from a local file or folder, each with where it is (file and row): JSONL, a JSON list, a folder's
``{split}.jsonl``, or the Hendrycks MATH folder layout ``{split}/{subject}/*.json``. A missing file, a byte that
is not UTF-8 or text that is not JSON raises :class:`DataError` naming the file and row.
"""

from __future__ import annotations

import json
import os

from .record_parsers import DataError


def read_local(path: str, split: str) -> list[tuple[str, dict]]:
    """(where, record) pairs from a JSONL/JSON file or a folder (``{split}.jsonl`` or MATH layout)."""
    if os.path.isdir(path):
        jsonl = os.path.join(path, f"{split}.jsonl")
        if os.path.isfile(jsonl):
            return read_local(jsonl, split)
        subject_root = os.path.join(path, split)
        if not os.path.isdir(subject_root):
            raise DataError(f"{path}: neither {split}.jsonl nor a {split}/<subject>/*.json folder")
        out = []
        for subject in sorted(os.listdir(subject_root)):
            for name in sorted(os.listdir(os.path.join(subject_root, subject))):
                file = os.path.join(subject_root, subject, name)
                if name.endswith(".json"):
                    record = _load_json(file, file)
                    record.setdefault("unique_id", f"{split}/{subject}/{name}")
                    out.append((file, record))
        return out
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file or folder")
    if path.endswith(".json"):
        data = _load_json(path, path)
        if not isinstance(data, list):
            raise DataError(f"{path}: a .json data file must hold a list of records")
        return [(f"{path}: row {i + 1}", r) for i, r in enumerate(data)]
    out = []
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            line = _utf8(raw, f"{path}: row {i + 1}")
            if line.strip():
                out.append((f"{path}: row {i + 1}", _load_json_line(line, f"{path}: row {i + 1}")))
    return out


def _utf8(raw: bytes, where: str) -> str:
    """``raw`` decoded, or a :class:`DataError` naming ``where`` and the offending byte.

    >>> _utf8(b"ok", "f: row 1")
    'ok'
    >>> _utf8(b'{"q": "caf\\xe9"}', "f: row 2")
    Traceback (most recent call last):
    ...
    tarpo.tasks.record_parsers.DataError: f: row 2: not UTF-8 (byte 0xe9 at column 11)
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start)
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        at = f"line {line + 1}, column {col}" if line else f"column {col}"
        raise DataError(f"{where}: not UTF-8 (byte 0x{raw[exc.start]:02x} at {at})") from None


def _load_json(file: str, where: str):
    with open(file, "rb") as f:
        return _load_json_line(_utf8(f.read(), where), where)


def _load_json_line(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
