"""The paper's published result tables, as packaged in ``resources/paper_tables.json``.

The JSON is written by ``scripts/transcribe_paper_tables.py`` from the paper's LaTeX
source: Tables 1-5 and 8-14, numbered as the compiled paper numbers them (Tables 6, 7
and 15 are hyperparameters, length settings and licenses). Each table holds its layout
(``row_headers``; column ``groups`` of a benchmark with metric ``columns``; model
``sections`` of ``rows``, each a ``system`` with its printed ``label``) and
:func:`published` lists every numeric cell as
``{"table", "model", "system", "benchmark", "metric", "value"}``.

Metrics: ``pass@1``, ``pass@32``, ``maj@32``, ``greedy`` (percent), ``sd`` (a fraction),
``ci_low``/``ci_high`` (percent; a layout column of metric ``ci`` prints both),
``tokens`` (#Tok, mean generated units). Benchmarks are task names of
:mod:`tarpo.tasks.registry`, plus ``average`` for the paper's Average columns.

    >>> cells = published()
    >>> len(cells), sorted({c["table"] for c in cells})
    (1038, [1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, 14])
    >>> tuple(published([1])[0].values())
    (1, 'Qwen2.5-1.5B-Instruct', 'CoT', 'gsm8k', 'pass@1', 60.89)
    >>> fmt(0.344, "sd"), fmt(97.1, "tokens"), fmt(60.9, "pass@1"), fmt(0.536, "ci_low")
    ('0.344', '97.1', '60.90', '0.536')
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

METRICS = ("pass@1", "pass@32", "maj@32", "sd", "ci_low", "ci_high", "tokens", "greedy")
DECIMALS = {"sd": 3, "tokens": 1}  # as the paper prints them; every other metric has 2
FIELDS = ("table", "model", "system", "benchmark", "metric", "value")


@lru_cache(maxsize=1)
def _spec_text() -> str:
    return resources.files("tarpo").joinpath("resources/paper_tables.json").read_text(encoding="utf-8")


def paper_tables() -> dict:
    """The whole packaged transcription (a fresh copy)."""
    return json.loads(_spec_text())


def published(tables=None) -> list[dict]:
    """Every published cell, in the paper's order (table, section, row, column); only ``tables`` if given."""
    keep = None if tables is None else {int(t) for t in tables}
    return [c for c in paper_tables()["published"] if keep is None or c["table"] in keep]


def fmt(value: float | None, metric: str) -> str | None:
    """A value with the paper's decimals for its metric (more if the value has more, as printed)."""
    if value is None:
        return None
    places = DECIMALS.get(metric, 2)
    text = repr(float(value))
    if "e" not in text and "." in text:
        places = max(places, len(text.split(".")[1]))
    return f"{value:.{places}f}"
