"""Runs ``python -m tarpo.runs.launch gsm8k`` several times, each run in a forked child that may be
SIGKILLed (or hit a full disk) at a chosen point of the save sequence (tests/test_checkpoints.py).

    python tests/workers/checkpoint_worker.py plan.json result.json

``plan.json``: ``{"env": {launcher variables}, "steps": [{"run": RUN_NAME, "kill": POINT or null, "enospc": POINT or
null, "signal": STEP or null, "signal_point": "load" | "final_save" | null, "env": {variables of this run}}, ...]}``
(``signal``: SIGTERM twice when that optimizer step begins, :func:`signal_at`; ``signal_point``: at that point of the
launch, :func:`signal_during`; EVAL=1 prints ``EVALUATED``, :func:`fake_evaluation`). The steps run one after the
other, each in a child forked from this process (which imports torch, transformers, TRL and tarpo once and never
computes, so the children start in a second instead of a process start each). A child SIGKILLs itself
(``os.kill(os.getpid(), SIGKILL)``: no ``finally``, no ``atexit``, nothing flushed) when the save reaches its point.
``result.json``: per step its ``status`` ("exit N" or "signal N"), the tail of its output and ``tree``, the sha256 of
every file then in its run folder.

Every run trains with a dense reward (the share of vowels) instead of the GSM8K grader, so that a
tiny random model gets a learning signal and every step changes the adapter and the router.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import sys
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _after(path: str, suffix: str) -> bool:
    return os.path.normpath(str(path)).endswith(os.path.normpath(suffix))


# point -> (what is patched, which call): the process dies when that call starts (or, for
# "router_ref", when it returns). The folder is checkpoint-2 of a 3-step run saving every step.
POINTS = {
    "empty": ("peft_save", lambda p: _after(p, "checkpoint-2")),               # folder made, nothing in it
    "adapter": ("torch_save", lambda p: _after(p, "checkpoint-2/optimizer.pt")),  # adapter only
    "optimizer": ("torch_save", lambda p: _after(p, "checkpoint-2/scheduler.pt")),  # adapter + optimizer
    "scheduler": ("torch_save", lambda p: _after(p, "checkpoint-2/rng_state.pth")),  # ... + scheduler
    "rng_state": ("state_json", lambda p: _after(p, "checkpoint-2/trainer_state.json")),  # before trainer_state
    "trainer_state": ("router_save", lambda p: _after(p, "checkpoint-2")),     # before the router
    "router": ("router_save", lambda p: _after(p, "checkpoint-2/router_ref")),  # before router_ref
    "router_ref": ("router_saved", lambda p: _after(p, "checkpoint-2/router_ref")),  # everything written
    # the last checkpoint (checkpoint-3) is saved; the final adapter/ is not
    "final": ("final_save", lambda p: True),
    # inside the final save: the adapter's weights written, its router not
    "final_router": ("router_save", lambda p: "checkpoint-" not in str(p) and "adapter" in os.path.basename(
        os.path.normpath(str(p)))),
}

# What torch.save raises on a full disk (seen on a full tmpfs with torch 2.13): no errno anywhere.
TORCH_DISK_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 640 vs 598"


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def signal_at(step: int) -> None:
    """Send this process SIGTERM twice when optimizer step ``step`` begins (after step ``step - 1``), as a
    scheduler's preemption does when it signals the whole process group and a launcher forwards the signal too:
    the second is a copy of the first (tarpo.training.preemption.DUPLICATE_S), not a request to stop at once."""
    from transformers.trainer_callback import CallbackHandler

    begin = CallbackHandler.on_step_begin

    def on_step_begin(self, args, state, control):
        if state.global_step == step - 1:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return begin(self, args, state, control)
    CallbackHandler.on_step_begin = on_step_begin


def signal_during(point: str) -> None:
    """Send this process SIGTERM twice (as :func:`signal_at`) when the launch reaches ``point``: ``load`` (the
    model's load, before training), ``last_checkpoint`` (the checkpoint transformers writes after the last step,
    inside ``train()`` but after that step's ``on_step_end``) or ``final_save`` (the final adapter's save, after
    training)."""
    from tarpo.runs import training_run

    if point == "last_checkpoint":
        from tarpo.training.trainer import TarpoTrainer
        save = TarpoTrainer._save_checkpoint

        def signalled_save(self, *args, **kwargs):
            if self.state.global_step == self.state.max_steps:
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
            return save(self, *args, **kwargs)
        TarpoTrainer._save_checkpoint = signalled_save
        return
    name = {"load": "load_run", "final_save": "save_final"}[point]
    original = getattr(training_run, name)

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)
    setattr(training_run, name, signalled)


def fake_evaluation() -> None:
    """EVAL=1 prints ``EVALUATED`` instead of evaluating (the tests ask whether it ran, not what it finds)."""
    from tarpo.runs import launch

    launch.evaluate = lambda cfg, adapter: print("EVALUATED", flush=True) or 0


def install(kill: str | None, enospc: str | None) -> None:
    """Patch the save functions so that the process dies (or the disk is full) at the point."""
    import shutil

    import peft
    import torch
    import transformers
    from transformers.trainer_callback import TrainerState

    import tarpo.tasks.graders
    from tarpo.engine.router import Router

    def vowels(prompts, completions, **columns):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]
    tarpo.tasks.graders.reward_function = lambda task, *a, **k: vowels

    point = kill or enospc
    if point is None:
        return
    kind, match = POINTS[point]

    def fire(path):
        if not match(path):
            return
        if kill:
            _die()
        # a full disk: part of the file is written, then the writer fails as torch's does
        if kind != "torch_save":
            raise OSError(28, "No space left on device")
        usage = shutil.disk_usage
        shutil.disk_usage = lambda p: usage(p)._replace(free=0)  # the disk is full from now on
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04" + b"\0" * 60)
        raise RuntimeError(TORCH_DISK_FULL) from RuntimeError("basic_ios::clear: iostream error")

    if kind == "torch_save":
        save = torch.save

        def torch_save(obj, f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)):
                fire(f)
            return save(obj, f, *args, **kwargs)
        torch.save = torch_save
    elif kind == "peft_save":
        save_pretrained = peft.PeftModel.save_pretrained

        def peft_save(self, save_directory, *args, **kwargs):
            fire(save_directory)
            return save_pretrained(self, save_directory, *args, **kwargs)
        peft.PeftModel.save_pretrained = peft_save
    elif kind == "state_json":
        save_to_json = TrainerState.save_to_json

        def state_json(self, json_path):
            fire(json_path)
            return save_to_json(self, json_path)
        TrainerState.save_to_json = state_json
    elif kind in ("router_save", "router_saved"):
        router_save = Router.save

        def save_router(self, directory, state=None):
            if kind == "router_save":
                fire(directory)
            router_save(self, directory, state)
            if kind == "router_saved":
                fire(directory)
        Router.save = save_router
    elif kind == "final_save":
        save_model = transformers.Trainer.save_model

        def final_save(self, output_dir=None, _internal_call=False):
            if not _internal_call:
                fire(output_dir)
            return save_model(self, output_dir, _internal_call)
        transformers.Trainer.save_model = final_save


def tree(folder: str) -> dict[str, str]:
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in files + [d + "/" for d in dirs]:
            rel = os.path.relpath(os.path.join(root, name.rstrip("/")), folder) + ("/" if name.endswith("/") else "")
            if name.endswith("/"):
                out[rel] = "dir"
            else:
                with open(os.path.join(root, name), "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def run_child(env: dict, step: dict, log: str) -> str:
    pid = os.fork()
    if pid == 0:  # the child: one launcher run
        code = 1
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
            sys.stderr = sys.stdout
            os.environ.update({**env, **step.get("env", {})})
            os.environ["RUN_NAME"] = step["run"]
            install(step.get("kill"), step.get("enospc"))
            if step.get("signal"):
                signal_at(step["signal"])
            if step.get("signal_point"):
                signal_during(step["signal_point"])
            fake_evaluation()
            from tarpo.runs.launch import main
            code = main(["gsm8k"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (print(exc.code) or 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(code or 0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"


def main(plan_path: str, result_path: str) -> None:
    import torch  # noqa: F401  everything the children need, imported once here
    import peft  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401

    import tarpo.runs.launch  # noqa: F401
    import tarpo.models.loading  # noqa: F401
    import tarpo.training.trainer  # noqa: F401
    import gc
    gc.freeze()  # the imports are never garbage: no child's collections walk them (nor copy their pages)

    with open(plan_path) as f:
        plan = json.load(f)
    out_dir = plan["env"]["OUT_DIR"]
    results = []
    for i, step in enumerate(plan["steps"]):
        log = os.path.join(os.path.dirname(os.path.abspath(result_path)), f"step{i}-{step['run']}.log")
        status = run_child(plan["env"], step, log)
        with open(log, errors="replace") as f:
            output = f.read()
        run_dir = os.path.join(out_dir, step["run"])
        results.append({**step, "status": status, "output": output[-6000:],
                        "tree": tree(run_dir) if os.path.isdir(run_dir) else {}})
    with open(result_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    from tarpo.process_exit import skip_the_final_collection
    skip_the_final_collection()  # as the project's commands: no last collection over the imports
    main(sys.argv[1], sys.argv[2])
