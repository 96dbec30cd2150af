"""Checkpoints and resuming: kills and a full disk during a save, finished runs, the metrics log.

The launcher runs go through tests/workers/checkpoint_worker.py: one process imports everything once and
forks one child per run; a child SIGKILLs itself at a point of the save sequence (or its save hits
a full disk), then the same run is launched again and must end with the adapter and router of an
uninterrupted run, bit for bit.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tarpo.models.tiny import char_tokenizer, tiny_causal_lm
from workers.checkpoint_worker import POINTS, TORCH_DISK_FULL

HERE = os.path.dirname(os.path.abspath(__file__))

# checkpoint-2 of a 3-step run saving every step is where the kills hit; "final*" hit after checkpoint-3
IN_CHECKPOINT_2 = [p for p in POINTS if not p.startswith("final")]
ENV = dict(MAX_STEPS="3", SAVE_STEPS="1", BATCH="4", GROUP_SIZE="4", MAX_PROMPT_LENGTH="400",
           MAX_COMPLETION_LENGTH="8", ACTION_BIAS="0,0", LORA_R="4", LORA_ALPHA="8", LR="1e-2", ROUTER_LR="1e-1",
           LR_SCHEDULE="constant", WARMUP="0", TRAIN_LIMIT="16", TEMPERATURE="1.0")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All launcher runs of this module, in one worker: an uninterrupted reference, a finished run
    launched again, every kill point (killed, then launched again) and a full disk (then again)."""
    root = tmp_path_factory.mktemp("ckpt")
    tok = char_tokenizer()
    tiny_causal_lm(tok, "qwen2", seed=0).save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    with open(root / "train.jsonl", "w") as f:
        for i in range(16):
            f.write(json.dumps({"question": f"What is {i} plus {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"})
                    + "\n")
    steps = [{"run": "ref"}, {"run": "done"}, {"run": "done"}]
    for point in POINTS:
        steps += [{"run": point, "kill": point}, {"run": point}]
    steps += [{"run": "enospc", "enospc": "adapter"}, {"run": "enospc"}]
    six = {"MAX_STEPS": "6", "SAVE_STEPS": "100"}  # a preemption: SIGTERM after step 3, no checkpoint due before 100
    steps += [{"run": "ref6", "env": six}, {"run": "sigterm", "env": six, "signal": 4}, {"run": "sigterm", "env": six}]
    # a stop signal outside a training step: at the model's load, in the last step, during the final save (EVAL=1)
    last = {"MAX_STEPS": "3", "SAVE_STEPS": "100", "EVAL": "1"}
    steps += [{"run": "sig_load", "signal_point": "load"}, {"run": "sig_load"},
              {"run": "sig_last", "env": last, "signal": 3}, {"run": "sig_last", "env": last},
              {"run": "sig_save", "env": last, "signal_point": "final_save"},
              {"run": "sig_ckpt", "env": last, "signal_point": "last_checkpoint"}]
    env = {**ENV, "MODEL": str(root / "tiny"), "DATA_PATH": str(root / "train.jsonl"), "OUT_DIR": str(root / "runs")}
    (root / "plan.json").write_text(json.dumps({"env": env, "steps": steps}))
    clean = {k: v for k, v in os.environ.items() if k not in ("MODEL", "ALGO", "SEED", "EVAL", "BETA", "DRY_RUN")}
    res = subprocess.run([sys.executable, os.path.join(HERE, "workers", "checkpoint_worker.py"),
                          str(root / "plan.json"), str(root / "result.json")],
                         capture_output=True, text=True, timeout=900, env={**clean, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((root / "result.json").read_text())
    by_run = {}
    for r in results:
        by_run.setdefault(r["run"], []).append(r)
    return by_run, root / "runs"


def tensors(run_dir):
    out = {}
    for rel in ["adapter/adapter_model.safetensors", "adapter/router.safetensors",
                "adapter/router_ref/router.safetensors"]:
        for k, v in load_file(os.path.join(run_dir, rel)).items():
            out[f"{rel}:{k}"] = v
    return out


def assert_same_result(ref_dir, run_dir):
    ref, got = tensors(ref_dir), tensors(run_dir)
    assert ref.keys() == got.keys()
    # exact: the rerun resumes from a saved checkpoint and replays the uninterrupted run's ops
    different = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert not different, f"{run_dir} differs from the uninterrupted run in {different}"


def train_steps(run_dir):
    """Steps of the training records (those with a reward) in metrics.jsonl, in file order."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r["step"] for r in map(json.loads, f) if "reward" in r]


def assert_finished_cleanly(step, run_dir):
    assert step["status"] == "exit 0", step["output"][-3000:]
    leftovers = sorted({k.split("/")[0] for k in step["tree"]} - {"adapter", "launch_config.json", "metrics.jsonl",
                                                                  "README.md", "checkpoint-1", "checkpoint-2",
                                                                  "checkpoint-3", "rollout_engine.json",
                                                                  "run_identity.json"})
    assert not leftovers, f"left in the run folder: {leftovers}"
    assert train_steps(run_dir) == [1, 2, 3]  # one record per step: the rolled-back ones are gone


def test_uninterrupted_run_trains_three_steps_that_change_the_adapter(runs):
    by_run, out = runs
    (ref,) = by_run["ref"]
    assert_finished_cleanly(ref, out / "ref")
    base = load_file(str(out / "ref" / "adapter" / "router_ref" / "router.safetensors"))
    trained = load_file(str(out / "ref" / "adapter" / "router.safetensors"))
    # exact: any change at all counts
    assert not torch.equal(base["proj.weight"], trained["proj.weight"])  # the comparisons below mean something


@pytest.mark.parametrize("point", list(POINTS))
def test_a_run_killed_at_any_point_of_a_save_finishes_like_an_uninterrupted_one(runs, point):
    by_run, out = runs
    killed, again = by_run[point]
    assert killed["status"] == "signal 9", killed["output"][-3000:]
    if point in IN_CHECKPOINT_2:  # written to a temporary folder: no checkpoint-2 until it is complete
        assert not any(k.startswith("checkpoint-2/") for k in killed["tree"]), sorted(killed["tree"])
    else:  # killed after the last checkpoint: no final adapter (or a complete one)
        assert "adapter/router.safetensors" not in killed["tree"]
    assert_finished_cleanly(again, out / point)
    assert_same_result(out / "ref", out / point)
    if point.startswith("final"):  # the last checkpoint is at MAX_STEPS: nothing more is trained
        assert "checkpoint-4/" not in again["tree"]


def test_a_full_disk_during_a_save_is_reported_and_a_rerun_finishes_like_an_uninterrupted_one(runs):
    by_run, out = runs
    failed, again = by_run["enospc"]
    assert failed["status"] == "exit 1", failed["output"][-3000:]
    assert "disk full while saving checkpoint-2 to " + str(out / "enospc") in failed["output"], \
        failed["output"][-3000:]
    assert "Traceback" not in failed["output"]
    assert sorted({k.split("/")[0] for k in failed["tree"]} & {"checkpoint-2", ".checkpoint-2.tmp"}) == []
    assert "checkpoint-1/trainer_state.json" in failed["tree"]
    assert_finished_cleanly(again, out / "enospc")
    assert_same_result(out / "ref", out / "enospc")


def test_a_rerun_of_a_finished_run_changes_nothing(runs):
    by_run, out = runs
    first, again = by_run["done"]
    assert_finished_cleanly(first, out / "done")
    assert again["status"] == "exit 0", again["output"][-3000:]
    assert "run already finished at step 3" in again["output"]
    assert again["tree"] == first["tree"]
    assert_same_result(out / "ref", out / "done")


# ---------------------------------------------------------------- without the launcher
FILES = ["adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth",
         "trainer_state.json", "router.safetensors", "router_config.json", "router_ref/router.safetensors",
         "router_ref/router_config.json"]


def fake_checkpoint(run_dir, step, drop=(), manifest=True):
    """``checkpoint-N`` as a save writes it (FILES, then their manifest), less the files in ``drop``."""
    from tarpo.training.checkpoints import write_manifest

    folder = run_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in FILES:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(json.dumps({"global_step": step}))
    if manifest:
        write_manifest(str(folder))
    for name in drop:
        os.remove(folder / name)
    return folder


def test_resume_takes_the_newest_complete_checkpoint_and_names_the_incomplete_ones(tmp_path):
    from tarpo.training.resume import last_complete_checkpoint, resume_point

    run = tmp_path / "run"
    fake_checkpoint(run, 1)
    good = fake_checkpoint(run, 2)
    fake_checkpoint(run, 3, drop=["router_ref/router.safetensors", "router_ref/router_config.json"])
    fake_checkpoint(run, 4, manifest=False)  # not written by this version
    (run / "checkpoint-5").mkdir()
    (fake_checkpoint(run, 7) / "optimizer.pt").write_text("{}")  # cut short
    (run / ".checkpoint-6.tmp" / "checkpoint-6").mkdir(parents=True)
    said = []
    assert last_complete_checkpoint(str(run), report=said.append) == str(good)
    text = "\n".join(said)
    for name, missing in [("checkpoint-3", "missing router_ref/router.safetensors, router_ref/router_config.json"),
                          ("checkpoint-4", "missing checkpoint_manifest.json"), ("checkpoint-5", "empty"),
                          ("checkpoint-7", "optimizer.pt (2 of 18 bytes)"), (".checkpoint-6.tmp", "did not finish")]:
        assert any(name in line and missing in line for line in said), text
    assert "checkpoint-1" not in text and "checkpoint-2" not in text
    assert last_complete_checkpoint(str(tmp_path / "nothing"), report=said.append) is None
    with pytest.raises(ValueError, match="checkpoint-4 has no checkpoint_manifest.json: it was not written by this"):
        resume_point(str(run / "checkpoint-4"), str(run), print)
    with pytest.raises(ValueError, match="checkpoint-3 is incomplete .missing router_ref/router.safetensors"):
        resume_point(str(run / "checkpoint-3"), str(run), print)
    assert resume_point(True, str(run), said.append) == str(good)


def test_a_run_is_finished_when_its_adapter_says_it_reached_the_planned_steps(tmp_path):
    from tarpo.training.checkpoints import FINAL_STATE, publish
    from tarpo.training.resume import finished_step

    run = tmp_path / "run"
    fake_checkpoint(run, 3)
    assert finished_step(str(run), 3, 1.0) is None  # no final adapter yet (a kill before the final save)
    (run / "adapter").mkdir()
    (run / "adapter" / FINAL_STATE).write_text(json.dumps({"global_step": 3, "max_steps": 3, "num_train_epochs": 1}))
    assert finished_step(str(run), 3, 1.0) == 3
    assert finished_step(str(run), 2, 1.0) == 3
    assert finished_step(str(run), 5, 1.0) is None  # MAX_STEPS raised: train on from checkpoint-3
    assert finished_step(str(run), -1, 1.0) == 3  # epoch-based, same epochs
    assert finished_step(str(run), -1, 2.0) is None
    fake_checkpoint(run, 4)  # a later run trained past the adapter and was killed before its final save
    assert finished_step(str(run), 3, 1.0) is None
    # publishing over an incomplete folder replaces it, leaving nothing aside
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "x").write_text("new")
    (run / "checkpoint-5").mkdir()
    (run / "checkpoint-5" / "y").write_text("old")
    publish(str(staged), str(run / "checkpoint-5"))
    assert os.listdir(run / "checkpoint-5") == ["x"] and not staged.exists()
    assert not [p for p in os.listdir(run) if p.startswith(".")]


def test_disk_full_is_recognised_in_each_form_a_save_reports_it(tmp_path, monkeypatch):
    import shutil

    from safetensors import SafetensorError

    from tarpo.training.checkpoints import is_disk_full

    torch_error = RuntimeError(TORCH_DISK_FULL)
    torch_error.__context__ = RuntimeError("basic_ios::clear: iostream error")
    assert is_disk_full(OSError(28, "No space left on device"), str(tmp_path))
    assert is_disk_full(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
                        str(tmp_path))
    assert not is_disk_full(torch_error, str(tmp_path))  # the same words from torch with room on the disk
    assert not is_disk_full(ValueError("bad value"), str(tmp_path))
    usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(p)._replace(free=4096))
    assert is_disk_full(torch_error, str(tmp_path))
    assert not is_disk_full(ValueError("bad value"), str(tmp_path))


def test_plot_reads_one_record_per_step_and_refuses_a_step_logged_twice(tmp_path):
    from tarpo.evaluation.plot import read_log

    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        for s in [1, 2, 3]:
            f.write(json.dumps({"step": s, "reward": float(s)}) + "\n")
        f.write(json.dumps({"step": 3, "train_runtime": 1.0}) + "\n")
        f.write('{"step": 4, "rew')  # a line cut by a kill
    assert [(r["step"], r["reward"]) for r in read_log(str(path))] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    with open(path, "a") as f:
        f.write("\n" + json.dumps({"step": 2, "reward": 0.0}) + "\n")  # two runs in one file
    with pytest.raises(ValueError, match=r"metrics.jsonl: step 2 is logged twice"):
        read_log(str(path))


def test_metrics_log_drops_the_steps_a_resumed_run_rolls_back(tmp_path):
    from transformers import TrainerControl, TrainerState

    from tarpo.training.callbacks import JsonlLogger

    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        for s in [1, 2, 3]:
            f.write(json.dumps({"step": s, "reward": 0.5}) + "\n")
        f.write('{"step": 4, "rew')
    logger = JsonlLogger(str(path))
    state = TrainerState()
    state.global_step = 2  # resumed from checkpoint-2
    logger.on_train_begin(None, state, TrainerControl())
    state.global_step = 3
    logger.on_log(None, state, TrainerControl(), logs={"reward": 1.0})
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["reward"]) for r in rows] == [(1, 0.5), (2, 0.5), (3, 1.0)]


def test_trainer_resumes_from_the_newest_complete_checkpoint_and_trains_nothing_past_max_steps(tokenizer, tmp_path):
    from test_trainer import letter_reward, make_args, make_dataset

    from tarpo.training.trainer import TarpoTrainer

    def trainer(max_steps):
        args = make_args(tmp_path, max_steps=max_steps, save_strategy="steps", save_steps=1,
                         lr_scheduler_type="constant", warmup_steps=0)
        return TarpoTrainer(model=tiny_causal_lm(tokenizer, seed=5), reward_funcs=letter_reward, args=args,
                            train_dataset=make_dataset(), processing_class=tokenizer)

    first = trainer(2)
    first.train()
    run = tmp_path / "run"
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(("checkpoint", "."))) == [
        "checkpoint-1", "checkpoint-2"]
    fake_checkpoint(run, 3, drop=["optimizer.pt"])  # a checkpoint that lost a file
    again = trainer(2)
    again.train(resume_from_checkpoint=True)  # checkpoint-2, already at max_steps: nothing to train
    assert again.state.global_step == 2
    for (n, a), (_, b) in zip(first.model.named_parameters(), again.model.named_parameters()):
        # exact: checkpoint-2 loaded back (a save/load round trip), nothing trained after it
        assert torch.equal(a, b), n
    # exact: the same save/load round trip
    torch.testing.assert_close(again.router.proj.weight, first.router.proj.weight, rtol=0, atol=0)
    assert not (run / "checkpoint-4").exists()
    with pytest.raises(ValueError, match="checkpoint-3.*incomplete.*optimizer.pt"):
        trainer(4).train(resume_from_checkpoint=str(run / "checkpoint-3"))


def test_a_run_sent_sigterm_saves_the_step_in_flight_and_its_rerun_ends_like_an_uninterrupted_one(runs):
    """SIGTERM after the third optimizer step of a 6-step run saving every 100 steps (twice, as a process group's
    and a launcher's copies arrive): step 4 finishes, checkpoint-4 is written whole, the run says so in one line and
    exits 75; the same command resumes from it and ends with the adapter and routers of the uninterrupted run, bit
    for bit. Before tarpo.training.preemption the run died at the signal with nothing saved: 3 steps lost."""
    by_run, out = runs
    (ref,) = by_run["ref6"]
    stopped, again = by_run["sigterm"]
    assert ref["status"] == "exit 0" and train_steps(out / "ref6") == [1, 2, 3, 4, 5, 6], ref["output"][-3000:]
    assert stopped["status"] == "exit 75", stopped["output"][-3000:]
    line = (f"tarpo launch: stopped by SIGTERM after step 4: {out / 'sigterm' / 'checkpoint-4'} is complete; run the "
            "same command again to resume from it (exit status 75)")
    assert line in stopped["output"].splitlines(), stopped["output"][-3000:]
    assert "checkpoint-4/checkpoint_manifest.json" in stopped["tree"] and "preempted.json" in stopped["tree"]
    assert not any(k.startswith(("adapter", ".checkpoint")) for k in stopped["tree"]), sorted(stopped["tree"])
    assert again["status"] == "exit 0" and "resuming from" in again["output"], again["output"][-3000:]
    assert "preempted.json" not in again["tree"] and train_steps(out / "sigterm") == [1, 2, 3, 4, 5, 6]
    assert_same_result(out / "ref6", out / "sigterm")


def test_a_stop_signal_outside_a_training_step_ends_the_launch_with_the_requeue_status(runs):
    """SIGTERM (twice, as a preemption sends it) at the model's load: nothing trained or saved, exit 75 and a line
    saying so, and the same command then trains the run; in the last step: the step and the final adapter saved,
    exit 75 before EVAL=1, whose re-run evaluates; during the final save: the save finishes, exit 75, no
    evaluation. Before tarpo.runs.launch_signals the load died of the signal (status -15, no line) and the last
    step's stop went on into EVAL=1."""
    by_run, out = runs
    load, again = by_run["sig_load"]
    assert load["status"] == "exit 75", load["output"][-3000:]
    assert ("tarpo launch: stopped by SIGTERM before training ended: nothing new was saved; run the same command "
            "again to start it again (exit status 75)") in load["output"].splitlines(), load["output"][-3000:]
    assert not any(k.startswith("checkpoint-") or k.startswith("adapter") for k in load["tree"]), sorted(load["tree"])
    assert again["status"] == "exit 0" and train_steps(out / "sig_load") == [1, 2, 3], again["output"][-3000:]
    last, evaluated = by_run["sig_last"]
    adapter = out / "sig_last" / "adapter"
    assert last["status"] == "exit 75" and "EVALUATED" not in last["output"], last["output"][-3000:]
    assert (f"tarpo launch: stopped by SIGTERM after training: {adapter} is complete; run the same command again to "
            "evaluate (EVAL=1) (exit status 75)") in last["output"].splitlines(), last["output"][-3000:]
    assert "adapter/final_state.json" in last["tree"] and "preempted.json" in last["tree"]
    assert evaluated["status"] == "exit 0" and "EVALUATED" in evaluated["output"], evaluated["output"][-3000:]
    (save,) = by_run["sig_save"]
    assert save["status"] == "exit 75" and "EVALUATED" not in save["output"], save["output"][-3000:]
    assert "adapter/final_state.json" in save["tree"] and f"{out / 'sig_save' / 'adapter'} is complete" in save[
        "output"]


def test_a_stop_signal_during_the_last_steps_checkpoint_ends_with_the_requeue_status(runs):
    """SIGTERM while transformers writes the checkpoint after the last step (inside train(), after that step's
    on_step_end, where SaveOnSignal turns no signal into a stop): the checkpoint and the final adapter are saved,
    exit 75 with its line, and EVAL=1 does not run. Before, the signal was recorded and forgotten: the run counted
    as finished, went on into EVAL=1 and exited 0."""
    by_run, out = runs
    (ckpt,) = by_run["sig_ckpt"]
    adapter = out / "sig_ckpt" / "adapter"
    assert ckpt["status"] == "exit 75" and "EVALUATED" not in ckpt["output"], ckpt["output"][-3000:]
    assert (f"tarpo launch: stopped by SIGTERM after training: {adapter} is complete; run the same command again to "
            "evaluate (EVAL=1) (exit status 75)") in ckpt["output"].splitlines(), ckpt["output"][-3000:]
    assert "adapter/final_state.json" in ckpt["tree"] and "checkpoint-3/checkpoint_manifest.json" in ckpt["tree"]
