"""The launcher's configuration, typed: :class:`LaunchConfig`, what :func:`tarpo.runs.presets.resolve` makes
of the launcher's variables (:func:`tarpo.runs.run_config.trainer_arguments` builds the run's
:class:`tarpo.config.TarpoConfig` from it).

A ``LaunchConfig`` is frozen: the steps after ``resolve`` (the device, the memory plan, the launch command)
each return a new one (:func:`dataclasses.replace`). ``DRY_RUN=1`` prints it and a run saves it as
``launch_config.json`` (:meth:`LaunchConfig.to_dict`: the same keys, ``trainer`` a plain dict).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class LaunchConfig:
    """A launcher run as resolved and checked; each field names the launcher variable that sets it."""

    dataset: str                  # the launcher: gsm8k, math or dapo (tarpo.runs.presets.DATASETS)
    task: str                     # the training data set's task (tarpo.tasks.registry)
    algo: str                     # ALGO (tarpo.algorithms.ALGOS)
    system: str                   # the algorithm's name in the paper's tables
    model: str                    # MODEL: a hub id or a local folder
    model_name: str               # the model's last path component
    run_dir: str                  # OUT_DIR/RUN_NAME (RUN_NAME by default from the settings)
    preset: str | None            # MODEL's preset (tarpo.runs.presets.MODELS), None for another model
    micro_batch: int | None       # MICRO_BATCH as set; None: the memory plan picks
    data_path: str | None         # DATA_PATH
    train_limit: int | None       # TRAIN_LIMIT
    eval: bool                    # EVAL
    eval_tasks: tuple[str, ...]   # the data set's benchmarks
    eval_mode: str                # the algorithm's evaluation mode (tarpo.algorithms.MODES)
    eval_n: int                   # EVAL_N
    eval_limit: int | None        # EVAL_LIMIT
    eval_data_dir: str | None     # EVAL_DATA_DIR
    dry_run: bool                 # DRY_RUN
    backend: str                  # BACKEND: auto, hf or unsloth (hf where FSDP2 shards)
    num_processes: int            # NUM_PROCESSES (else the ACCELERATE_CONFIG's), of every machine together
    accelerate_config: str | None  # ACCELERATE_CONFIG
    sharding: str | None          # "fsdp2" when the ACCELERATE_CONFIG shards the model
    num_machines: int             # NUM_MACHINES, MACHINE_RANK, MAIN_PROCESS_IP, MAIN_PROCESS_PORT
    machine_rank: int
    main_process_ip: str | None
    main_process_port: int | None
    cpu_max_hours: float          # CPU_MAX_HOURS
    bf16_set: bool                # BF16 was set: a CPU run then trains in bf16 too (else in fp32)
    trainer: Mapping[str, object]  # TarpoConfig's keyword arguments (read-only)
    memory_plan: Mapping[str, object] | None = None  # tarpo.runs.run_config.plan_memory's result
    launch_command: str | None = None  # the accelerate launch command of a run with several processes

    def __post_init__(self):
        object.__setattr__(self, "trainer", MappingProxyType(dict(self.trainer)))
        if self.memory_plan is not None:
            object.__setattr__(self, "memory_plan", MappingProxyType(dict(self.memory_plan)))
        object.__setattr__(self, "eval_tasks", tuple(self.eval_tasks))

    def with_trainer(self, **changes) -> "LaunchConfig":
        """This configuration with some of TarpoConfig's arguments changed.

        >>> from tarpo.runs.presets import resolve
        >>> resolve("math", {}).with_trainer(seed=3).trainer["seed"]
        3
        """
        return dataclasses.replace(self, trainer={**self.trainer, **changes})

    def on_device(self, cuda: bool) -> "LaunchConfig":
        """Without CUDA, a run trains in fp32 unless BF16 was set (a tiny local model on the CPU)."""
        return self if cuda or self.bf16_set else self.with_trainer(bf16=False)

    def to_dict(self) -> dict:
        """The configuration as JSON takes it (``launch_config.json``, ``DRY_RUN=1``'s last line)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["trainer"] = dict(self.trainer)
        out["memory_plan"] = None if self.memory_plan is None else dict(self.memory_plan)
        out["eval_tasks"] = list(self.eval_tasks)
        return out

    def listing(self) -> str:
        """What ``DRY_RUN=1`` prints: a line a setting, then the whole configuration as one JSON object."""
        as_dict = self.to_dict()
        lines = [f"{key:>16} = {value}" for key, value in as_dict.items() if key != "trainer"]
        lines += [f"{'trainer.' + key:>32} = {value}" for key, value in as_dict["trainer"].items()]
        return "\n".join([*lines, json.dumps(as_dict, sort_keys=True)])
