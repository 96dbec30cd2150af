"""A trained system is evaluated with its run's routing settings (tarpo.algorithms.RULE_SETTINGS beside the adapter):
``tarpo case`` and ``tarpo eval`` in mode ``entropy`` use the threshold the run was trained with unless a flag says
otherwise, and the three evaluations (``tarpo eval``, ``tarpo case``, the demo) build their rollout settings with one
constructor (tarpo.evaluation.system.rollout_spec)."""

import json

import datasets
import pytest

from helpers import one_step_run
from tarpo.cli import main as cli
from tarpo.config import TarpoConfig, default
from tarpo.models.tiny import char_tokenizer, tiny_causal_lm
from tarpo.training.trainer import TarpoTrainer

THRESHOLD = 0.123  # not TarpoConfig's default
SOFT_WHEN = "low"


@pytest.fixture(scope="module")
def entropy_run(tmp_path_factory):
    """A tiny model trained one step with routing ``entropy`` at a threshold of its own, its adapter saved."""
    assert default("entropy_threshold") != THRESHOLD and default("entropy_soft_when") != SOFT_WHEN
    return one_step_run(tmp_path_factory.mktemp("entropy"), routing="entropy", entropy_threshold=THRESHOLD,
                        entropy_soft_when=SOFT_WHEN)


def questions(root) -> str:
    folder = root / "data" / "gsm8k"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test.jsonl").write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
                                               for i in range(2)))
    return str(root / "data")


def test_case_in_mode_entropy_decodes_with_the_runs_threshold(entropy_run, tmp_path, monkeypatch):
    """Before: ``tarpo case`` passed only T_s and k, so mode entropy decoded at the default threshold."""
    from tarpo.evaluation import case_study

    specs, sample = [], case_study.sample
    monkeypatch.setattr(case_study, "sample", lambda system, chosen, n, spec, **kw: specs.append(spec) or sample(
        system, chosen, n, spec, **kw))
    base = ["case", "--model", str(entropy_run / "model"), "--adapter", str(entropy_run / "adapter"), "--mode",
            "entropy", "--task", "gsm8k", "--data-dir", questions(tmp_path), "--ids", "0", "--n", "2",
            "--max-new-tokens", "4"]
    assert cli([*base, "--out", str(tmp_path / "a.html")]) == 0
    assert (specs[-1].entropy_threshold, specs[-1].entropy_soft_when) == (THRESHOLD, SOFT_WHEN)
    assert cli([*base, "--entropy-threshold", "2.5", "--out", str(tmp_path / "b.html")]) == 0  # a flag overrides
    assert (specs[-1].entropy_threshold, specs[-1].entropy_soft_when) == (2.5, SOFT_WHEN)
    saved = json.loads((entropy_run / "adapter" / "routing_settings.json").read_text())
    assert saved == {"routing": "entropy", "entropy_threshold": THRESHOLD, "entropy_temperature": 1.0,
                     "entropy_soft_when": SOFT_WHEN}


def test_eval_in_mode_entropy_records_the_runs_threshold(entropy_run, tmp_path):
    out = tmp_path / "eval"
    assert cli(["eval", "--model", str(entropy_run / "model"), "--adapter", str(entropy_run / "adapter"), "--mode",
                "entropy", "--tasks", "gsm8k", "--data-dir", questions(tmp_path), "--n", "2", "--max-new-tokens",
                "4", "--out", str(out)]) == 0
    settings = json.loads((out / "gsm8k.settings.json").read_text())
    assert (settings["entropy_threshold"], settings["entropy_soft_when"]) == (THRESHOLD, SOFT_WHEN)


@pytest.mark.parametrize("content, named", [
    ("not json", "routing_settings.json: not a JSON object"),
    ('{"routing": "entropy", "entropy_threshold": "high"}', "entropy_threshold='high': not a float"),
])
def test_a_damaged_settings_file_is_refused_naming_it(entropy_run, tmp_path, capsys, content, named):
    """A hostile or damaged routing_settings.json: ``tarpo case`` refuses it naming the file, before loading."""
    import shutil
    adapter = tmp_path / "adapter"
    shutil.copytree(entropy_run / "adapter", adapter)
    (adapter / "routing_settings.json").write_text(content)
    assert cli(["case", "--model", str(entropy_run / "model"), "--adapter", str(adapter), "--mode", "entropy",
                "--task", "gsm8k", "--data-dir", questions(tmp_path), "--ids", "0", "--n", "2",
                "--out", str(tmp_path / "c.html")]) == 2
    assert named in capsys.readouterr().err


def test_the_three_evaluations_decode_with_the_same_settings(entropy_run, tmp_path, monkeypatch):
    """tarpo eval, tarpo case and the demo's evaluation, given the same new tokens and temperature, hand ``sample``
    the same rollout settings (one constructor, tarpo.evaluation.system.rollout_spec: every other field at
    TarpoConfig's default), but for what each sets by design: eval's per-task shape, case's run settings."""
    import argparse
    import dataclasses

    from tarpo.evaluation import case_study, pipeline
    from tarpo.runs import demo

    specs = {}
    for name, module in (("eval", pipeline), ("case", case_study), ("demo", demo)):
        original = module.sample
        monkeypatch.setattr(module, "sample", lambda system, examples, n, spec, *a, _name=name, _f=original, **kw:
                            specs.setdefault(_name, spec) and _f(system, examples, n, spec, *a, **kw))
    model, adapter, data = str(entropy_run / "model"), str(entropy_run / "adapter"), questions(tmp_path)
    assert cli(["eval", "--model", model, "--adapter", adapter, "--mode", "cot", "--tasks", "gsm8k", "--data-dir",
                data, "--n", "2", "--max-new-tokens", "4", "--temperature", "0.7", "--engine", "eager",
                "--out", str(tmp_path / "eval")]) == 0
    assert cli(["case", "--model", model, "--adapter", adapter, "--mode", "cot", "--task", "gsm8k", "--data-dir", data,
                "--ids", "0", "--n", "2", "--max-new-tokens", "4", "--temperature", "0.7",
                "--out", str(tmp_path / "c.html")]) == 0
    demo.evaluate_system("cot", model, None, argparse.Namespace(
        max_new_tokens=4, temperature=0.7, eval_questions=1, eval_n=2, seed=0, out=str(tmp_path)))
    by_design = {"batch_size", "max_prompt_length", "engine", "routing", "entropy_threshold", "entropy_soft_when",
                 "entropy_temperature"}
    views = {name: {k: v for k, v in dataclasses.asdict(spec).items() if k not in by_design}
             for name, spec in specs.items()}
    assert set(views) == {"eval", "case", "demo"}
    assert views["eval"] == views["case"] == views["demo"], views
    assert views["demo"]["temperature"] == 0.7 and views["demo"]["soft_top_k"] == default("soft_top_k")


def test_the_runs_chat_template_arguments_template_the_evaluations_prompts(tmp_path, monkeypatch):
    """A run trained with chat_template_kwargs saves them beside its adapter, and evaluation templates its prompts
    with them (before: training's prompts ended "!" and evaluation's did not)."""
    from tarpo.evaluation import sample as sample_module
    from tarpo.evaluation.system import load_system

    tok = char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if shout %}!{% endif %}"
    tiny_causal_lm(tok, "qwen2", seed=0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    args = TarpoConfig(output_dir=str(tmp_path / "run"), routing="hard", per_device_train_batch_size=2,
                       num_generations=2, max_completion_length=4, max_steps=1, report_to="none",
                       save_strategy="no", bf16=False, lora_r=4, lora_alpha=8, chat_template_kwargs={"shout": True})
    data = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 2)
    trainer = TarpoTrainer(str(tmp_path / "model"), lambda completions, **kw: [0.0, 1.0], args=args,
                           train_dataset=data)
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    saved = json.loads((tmp_path / "adapter" / "routing_settings.json").read_text())
    assert saved["chat_template_kwargs"] == {"shout": True}
    system = load_system(str(tmp_path / "model"), str(tmp_path / "adapter"), "cot", device="cpu")
    prompts = []
    generate = sample_module.hybrid_generate
    monkeypatch.setattr(sample_module, "hybrid_generate", lambda policy, ids, mask, spec, **kw: prompts.append(
        ids) or generate(policy, ids, mask, spec, **kw))
    from tarpo.engine.rollout import RolloutSpec
    sample_module.sample(system, [{"id": "0", "prompt": [{"role": "user", "content": "hi"}]}], 2,
                         RolloutSpec(max_new_tokens=2), max_prompt_length=16)
    assert tok.decode(prompts[0][0], skip_special_tokens=True).endswith("hi!")
