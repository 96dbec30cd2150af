"""A training run decodes at one decode-merge level for its whole life (``TarpoConfig.decode_merge``; the levels:
:mod:`tarpo.engine.decode_weights`).

The level decides the compiled rollout's bf16 numerics (merged copies or the adapter applied), and ``auto`` chooses
it from the memory free when the run's first compiled rollout starts, so the same settings can choose another level
after a resume on a busier device, and a launch may pass another ``decode_merge`` (the launcher's plan chooses one
for the device it finds). So the level of the run's first compiled rollout is written into the run folder
(:data:`RECORD` in ``output_dir``) and every later rollout of the run, a resumed one's too, decodes at it; a
``decode_merge`` that asks for another level is overruled, with a warning naming both.
"""

from __future__ import annotations

import json
import logging
import os

from ..atomic_files import write_json_atomic
from ..engine import decode_weights

logger = logging.getLogger(__name__)

RECORD = "decode_merge.json"


class RunDecodeLevel:
    """The run's level: read from ``output_dir`` (None until the first compiled rollout has run), written there by
    the main process once that rollout has chosen it."""

    def __init__(self, output_dir: str, main_process: bool):
        self.path, self.main = os.path.join(output_dir, RECORD), main_process
        self.level, self.warned = None, False
        if os.path.isfile(self.path):
            with open(self.path) as f:
                self.level = json.load(f)["decode_merge"]

    def requested(self, configured: str) -> str:
        """What the next rollout asks for: the run's level once there is one, else ``configured``."""
        if self.level is None:
            return configured
        if configured not in ("auto", self.level) and not self.warned:
            self.warned = True
            logger.warning("decode_merge=%s: this run decodes at %s, the level it started with (%s); a new run "
                           "(another output_dir) takes the setting", configured, self.level, self.path)
        return self.level

    def record(self, model, engine: str) -> None:
        """After a rollout: the level the compiled engine decoded ``model`` at becomes the run's, if it has none."""
        if self.level is not None or engine != "compiled":
            return
        self.level = decode_weights.level_used(model)
        if self.level is not None and self.main:
            write_json_atomic(self.path, {"decode_merge": self.level})
