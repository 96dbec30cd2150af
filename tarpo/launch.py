"""What ``run_gsm8k.sh``, ``run_math.sh`` and ``run_dapo.sh`` run: ``python -m tarpo.launch <dataset>``.

The launcher's shell variables (and the environment) override the presets of
:mod:`tarpo.presets`; an empty variable means "the paper's value". Steps:

1. resolve the configuration and check it (bad values name their variable);
   ``DRY_RUN=1`` prints it, the last line being the configuration as one JSON object;
2. refuse to start a hub model without CUDA (a tiny local model may run on CPU);
3. train with :class:`tarpo.trainer.TarpoTrainer` into the run folder (``launch_config.json``,
   ``metrics.jsonl``, checkpoints, ``adapter/`` with the router), resuming from the newest
   complete checkpoint there if any (:mod:`tarpo.checkpoints`); a finished run is a no-op;
4. with ``EVAL=1``, evaluate the trained system on the data set's benchmarks with
   ``tarpo eval`` into ``<run>/eval``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from .files import write_json_atomic
from .presets import resolve

TINY_PARAMS = 100_000_000


def estimated_params(folder: str) -> int | None:
    """Parameter count estimated from a local model folder's config.json (None if unreadable)."""
    try:
        with open(os.path.join(folder, "config.json")) as f:
            c = json.load(f)
        h, layers, inter, vocab = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    except (OSError, KeyError, ValueError):
        return None
    return layers * (4 * h * h + 3 * h * inter) + 2 * vocab * h


def check_runnable(cfg: dict, cuda: bool) -> None:
    """Without CUDA only a tiny local model may train (the CPU path is for tests and demos)."""
    if cuda:
        return
    n = estimated_params(cfg["model"]) if os.path.isdir(cfg["model"]) else None
    if n is None or n > TINY_PARAMS:
        raise SystemExit(
            f"No CUDA device: {cfg['model']} needs a GPU for this run. On a CPU-only machine run the demo "
            "instead (`bash run_demo.sh`), or set MODEL to a tiny local model folder "
            f"(< {TINY_PARAMS // 10**6}M parameters) to try the pipeline.")


def check_data(cfg: dict) -> None:
    path = cfg["data_path"]
    if path is not None and not os.path.exists(path):
        raise ValueError(f"DATA_PATH={path}: no such file or folder")
    root = cfg["eval_data_dir"]
    if root is not None and not os.path.isdir(root):
        raise ValueError(f"EVAL_DATA_DIR={root}: no such folder")
    if cfg["eval"] and root is not None:
        missing = [t for t in cfg["eval_tasks"] if not os.path.exists(os.path.join(root, t))]
        if missing:
            raise ValueError(f"EVAL_DATA_DIR={root}: no folder for {', '.join(missing)} (EVAL=1 evaluates "
                             f"{', '.join(cfg['eval_tasks'])})")


def check_trainer(cfg: dict, cuda: bool) -> None:
    """Build the trainer's configuration once, before anything is loaded or written; an invalid
    field is reported under the launcher variable that sets it."""
    import re

    from .config import TarpoConfig
    from .modeling import resolve_backend
    from .presets import variable_of
    from .rollout import engine_for_backend
    with tempfile.TemporaryDirectory() as scratch:  # nothing may appear in the run folder yet
        try:
            TarpoConfig(**{**cfg["trainer"], "bf16": cfg["trainer"]["bf16"] and cuda, "output_dir": scratch},
                        report_to="none")
            engine_for_backend(cfg["trainer"].get("rollout_engine", "auto"), resolve_backend(cfg["backend"]), "ENGINE")
        except ValueError as exc:
            raise ValueError(re.sub(r"TarpoConfig\.(\w+)=",
                                    lambda m: f"{variable_of(m[1]) or 'TarpoConfig.' + m[1]}=", str(exc))) from None


def print_config(cfg: dict) -> None:
    for key, value in cfg.items():
        if key != "trainer":
            print(f"{key:>16} = {value}")
    for key, value in cfg["trainer"].items():
        print(f"{'trainer.' + key:>32} = {value}")
    print(json.dumps(cfg, sort_keys=True))


def train(cfg: dict) -> str:
    """Train into ``cfg['run_dir']``; returns the saved adapter folder."""
    from .callbacks import JsonlLogger
    from .checkpoints import DiskFull, finished_step, last_complete_checkpoint, remove_partial_saves, save_final
    from .config import TarpoConfig
    from .graders import reward_function
    from .modeling import load_tokenizer, training_policy
    from .prompts import count_too_long
    from .tasks import load_task
    from .trainer import TarpoTrainer

    run_dir = cfg["run_dir"]
    args = TarpoConfig(**cfg["trainer"], report_to="none")  # validates every field before the model loads
    adapter, gate = os.path.join(run_dir, "adapter"), args.routing == "hrpo"
    done = finished_step(run_dir, args.max_steps, args.num_train_epochs, gate=gate)
    if done is not None:  # a re-run of a finished run: nothing is loaded, trained or written
        print(f"run already finished at step {done}; nothing to do ({adapter} is its adapter; raise MAX_STEPS "
              "to train further, or set another RUN_NAME/OUT_DIR for a new run)")
        return adapter
    dataset = load_task(cfg["task"], cfg["data_path"], "train", limit=cfg["train_limit"])
    tokenizer = load_tokenizer(cfg["model"])
    count_too_long(tokenizer, dataset["prompt"], args.max_prompt_length)  # a prompt that cannot fit: refused now
    os.makedirs(run_dir, exist_ok=True)
    write_json_atomic(os.path.join(run_dir, "launch_config.json"), cfg)
    model = training_policy(cfg["model"], args, cfg["backend"], "bfloat16" if args.bf16 else "float32")
    trainer = TarpoTrainer(model=model, reward_funcs=reward_function(cfg["task"]), args=args, train_dataset=dataset,
                           processing_class=tokenizer,
                           callbacks=[JsonlLogger(os.path.join(run_dir, "metrics.jsonl"))])
    for name in remove_partial_saves(run_dir):
        print(f"removed {name}: a save that a kill or a full disk interrupted")
    last = last_complete_checkpoint(run_dir, gate=gate)  # the newest complete one; says which it skips
    if last is not None:
        print(f"resuming from {last}")
    try:
        trainer.train(resume_from_checkpoint=last)  # from a checkpoint at the last step: trains nothing
        save_final(trainer, adapter)  # adapter/ appears complete, with final_state.json
    except DiskFull as exc:
        raise SystemExit(f"tarpo launch: error: {exc}") from None
    return adapter


def evaluate(cfg: dict, adapter: str) -> int:
    from .cli import main as cli
    args = ["eval", "--model", cfg["model"], "--adapter", adapter, "--mode", cfg["eval_mode"], "--system",
            cfg["system"], "--tasks", ",".join(cfg["eval_tasks"]), "--n", str(cfg["eval_n"]),
            "--out", os.path.join(cfg["run_dir"], "eval"), "--seed", str(cfg["trainer"]["seed"]),
            "--backend", cfg["backend"]]
    for name in ("entropy_threshold", "entropy_temperature"):  # mode entropy routes as training did
        if name in cfg["trainer"]:
            args += [f"--{name.replace('_', '-')}", str(cfg["trainer"][name])]
    if cfg["eval_limit"]:
        args += ["--limit", str(cfg["eval_limit"])]
    if cfg["eval_data_dir"]:
        args += ["--data-dir", cfg["eval_data_dir"]]
    return cli(args)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tarpo.launch {gsm8k|math|dapo}   (settings come from the environment)",
              file=sys.stderr)
        return 2
    import torch
    cuda = torch.cuda.is_available()
    try:
        cfg = resolve(argv[0], dict(os.environ))
        check_data(cfg)
        check_trainer(cfg, cuda)
    except ValueError as exc:
        print(f"tarpo launch: error: {exc}", file=sys.stderr)
        return 2
    if cfg["dry_run"]:
        print_config(cfg)
        return 0
    check_runnable(cfg, cuda)
    if not cuda and "BF16" not in os.environ:
        cfg["trainer"]["bf16"] = False  # a tiny local model on CPU trains in fp32
    try:
        adapter = train(cfg)
    except ValueError as exc:
        print(f"tarpo launch: error: {exc}", file=sys.stderr)
        return 2
    print(f"adapter and router saved to {adapter}")
    return evaluate(cfg, adapter) if cfg["eval"] else 0


if __name__ == "__main__":
    sys.exit(main())
