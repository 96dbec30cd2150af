"""REPORT_TO: the launcher passes it on as TRL's ``report_to`` (none by default): a run reports what it logs to
TensorBoard, Weights & Biases or any integration transformers has."""

import json

import pytest

from test_launch import tiny_model_folder

# the launcher's own variables, left to each test (what run_*.sh exports, empty, means the preset)
LAUNCH = ("MODEL", "ALGO", "SEED", "EVAL", "BETA", "DRY_RUN", "NUM_PROCESSES", "ACCELERATE_CONFIG", "MICRO_BATCH",
          "CPU_MAX_HOURS", "REPORT_TO", "RANK", "LOCAL_RANK", "TARPO_LAUNCHED", "TENSORBOARD_LOGGING_DIR")


def test_report_to_is_none_by_default_and_takes_a_list():
    from tarpo.runs.presets import resolve

    assert resolve("math", {}).trainer["report_to"] == "none"  # shown by DRY_RUN=1 with every default
    assert resolve("math", {"REPORT_TO": "tensorboard"}).trainer["report_to"] == "tensorboard"
    assert resolve("math", {"REPORT_TO": "tensorboard, wandb"}).trainer["report_to"] == ["tensorboard", "wandb"]


def test_an_unknown_integration_is_refused_naming_report_to_before_anything_loads():
    from tarpo.runs.run_config import trainer_arguments
    from tarpo.runs.presets import resolve

    with pytest.raises(ValueError, match=r"^REPORT_TO='tensorbord': tensorbord is not supported, only .*tensorboard"):
        trainer_arguments(resolve("math", {"REPORT_TO": "tensorbord"}), cuda=False)


def test_two_steps_reported_to_tensorboard_hold_the_loss_reward_and_router_scalars(tmp_path, monkeypatch, capsys):
    """A launcher run of a tiny local model for 2 steps with REPORT_TO=tensorboard: the event file in the run folder
    holds, for steps 1 and 2, the loss, the reward and the router's metrics, equal to metrics.jsonl's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tarpo.config import TarpoConfig
    from tarpo.runs import launch

    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(8)))
    env = dict(MODEL=tiny_model_folder(tmp_path / "tiny"), DATA_PATH=str(data), OUT_DIR=str(tmp_path / "runs"),
               MAX_STEPS="2", BATCH="8", GROUP_SIZE="4", MAX_COMPLETION_LENGTH="12", ACTION_BIAS="0,0", LORA_R="4",
               LORA_ALPHA="8", REPORT_TO="tensorboard")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    built = []  # the launch validates a TarpoConfig, plans from it, then trains with the final one (run_config)
    post_init = TarpoConfig.__post_init__
    monkeypatch.setattr(TarpoConfig, "__post_init__", lambda self: built.append(self) or post_init(self))
    assert launch.main(["gsm8k"]) == 0, capsys.readouterr().err[-3000:]
    assert len(built) == 2
    (run,) = (tmp_path / "runs").iterdir()
    (events,) = run.glob("runs/*/events.out.tfevents.*")  # transformers' TensorBoardCallback: <output_dir>/runs/<time>
    board = EventAccumulator(str(events.parent))
    board.Reload()
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {row["step"]: row for row in logged if "loss" in row}
    assert sorted(steps) == [1, 2]
    scalars = board.Tags()["scalars"]
    for key in ("loss", "reward", "rewards/correct_gsm8k/mean", "router/p_soft", "soft_ratio", "learning_rate"):
        points = board.Scalars(f"train/{key}")
        assert [p.step for p in points] == [1, 2], (key, scalars)
        assert [p.value for p in points] == pytest.approx([steps[1][key], steps[2][key]], rel=1e-6, abs=1e-7), key
    assert json.loads((run / "launch_config.json").read_text())["trainer"]["report_to"] == "tensorboard"
