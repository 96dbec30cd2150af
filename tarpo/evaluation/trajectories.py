"""Resumable trajectory files: one JSON line per sample, written chunk by chunk.

An evaluation of one task writes ``<out>/<task>.jsonl`` (the trajectories) and, before the
first line, ``<out>/<task>.settings.json`` (everything that decides the samples). The
questions are cut into fixed chunks of ``questions_per_chunk``; chunk ``c`` is sampled with
its own seed, so it comes out the same whether or not earlier chunks ran in this process.
A chunk's lines are appended and flushed together once the chunk is graded.

Re-opening the file keeps the complete chunks and drops a partial last one (a run killed
while writing), so a resumed run has exactly ``n`` lines per question, no duplicates, and
the same samples as an uninterrupted run. Different settings refuse to mix with an old
file unless ``restart=True``, which deletes it.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> f = TrajectoryFile(d, "gsm8k", {"n": 2, "seed": 0}, questions=3, questions_per_chunk=2)
    >>> f.done_chunks(), f.chunks
    (0, [(0, 2), (2, 3)])
    >>> f.append([{"id": "q0", "sample": 0}, {"id": "q0", "sample": 1}, {"id": "q1", "sample": 0}])  # cut short
    >>> f = TrajectoryFile(d, "gsm8k", {"n": 2, "seed": 0}, questions=3, questions_per_chunk=2)
    >>> f.done_chunks(), len(f.records)  # the partial chunk is dropped from the file too
    (0, 0)
    >>> f.append([{"id": "q0", "sample": 0}, {"id": "q0", "sample": 1}, {"id": "q1", "sample": 0},
    ...           {"id": "q1", "sample": 1}])
    >>> TrajectoryFile(d, "gsm8k", {"n": 2, "seed": 0}, questions=3, questions_per_chunk=2).done_chunks()
    1
    >>> TrajectoryFile(d, "gsm8k", {"n": 4, "seed": 0}, questions=3, questions_per_chunk=2)
    Traceback (most recent call last):
    ...
    ValueError: ...gsm8k.jsonl was written with other settings (n: 2 -> 4); pass --restart to start over
"""

from __future__ import annotations

import json
import os

from ..atomic_files import write_json_atomic


class TrajectoryFile:
    def __init__(self, out_dir: str, name: str, settings: dict, questions: int, questions_per_chunk: int,
                 restart: bool = False):
        self.path = os.path.join(out_dir, f"{name}.jsonl")
        self.settings_path = os.path.join(out_dir, f"{name}.settings.json")
        self.settings = {**settings, "questions": questions, "questions_per_chunk": questions_per_chunk}
        self.n = settings["n"]
        #: question ranges [start, stop) of the chunks, in order
        self.chunks = [(a, min(a + questions_per_chunk, questions)) for a in range(0, questions, questions_per_chunk)]
        if restart:
            for p in (self.path, self.settings_path):
                if os.path.exists(p):
                    os.remove(p)
        self._check_settings()
        self.records = self._read_complete_chunks()

    def _check_settings(self) -> None:
        if not os.path.exists(self.settings_path):
            if os.path.exists(self.path):
                raise ValueError(f"{self.path} has no {os.path.basename(self.settings_path)} beside it; "
                                 "pass --restart to start over")
            return
        with open(self.settings_path) as f:
            old = json.load(f)
        changed = [f"{k}: {old.get(k)!r} -> {self.settings.get(k)!r}" for k in sorted(set(old) | set(self.settings))
                   if old.get(k) != self.settings.get(k)]
        if changed:
            raise ValueError(f"{self.path} was written with other settings ({'; '.join(changed)}); "
                             "pass --restart to start over")

    def _read_complete_chunks(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, "rb") as f:
            lines = f.read().split(b"\n")[:-1]  # the last piece is "" or a line cut short
        keep, size = 0, 0
        for start, stop in self.chunks:
            end = keep + (stop - start) * self.n
            if end > len(lines):
                break
            keep, size = end, size + sum(len(line) + 1 for line in lines[keep:end])
        if size != os.path.getsize(self.path):
            os.truncate(self.path, size)  # drop the partial last chunk
        return [json.loads(line) for line in lines[:keep]]

    def done_chunks(self) -> int:
        """How many chunks (from the first) are complete on disk."""
        done, lines = 0, 0
        for start, stop in self.chunks:
            lines += (stop - start) * self.n
            if lines > len(self.records):
                break
            done += 1
        return done

    def append(self, records: list[dict]) -> None:
        """Append lines (normally one whole chunk) and flush them to disk."""
        if not os.path.exists(self.settings_path):
            write_json_atomic(self.settings_path, self.settings)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())
        self.records.extend(records)
