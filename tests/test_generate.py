"""``tarpo generate`` (tarpo/cli/generate.py, tarpo/evaluation/generate.py): completions of a trained TARPO model
for prompts of one's own, through the hybrid loop, soft steps shown or hidden; bad input refused before loading."""

import json

import pytest

from helpers import one_step_run
from tarpo.cli import main as cli
from tarpo.evaluation.generate import generate


@pytest.fixture(scope="module")
def soft_run(tmp_path_factory):
    """A tiny model trained one TARPO step with a router that goes soft almost always (b0 = [-4.6, 0]), saved."""
    return one_step_run(tmp_path_factory.mktemp("generate"), routing="learned", action_bias=[-4.6, 0.0])


def run_cli(capsys, root, *flags):
    status = cli(["generate", "--model", str(root / "model"), "--adapter", str(root / "adapter"),
                  "--max-new-tokens", "8", *flags])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_generate_samples_each_prompt_n_times_with_soft_steps_marked(soft_run, capsys):
    status, out, _ = run_cli(capsys, soft_run, "--prompt", "1 + 1 =", "--prompt", "2 + 2 =", "--n", "2", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and [(r["prompt"], r["sample"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in rows:
        assert len(r["actions"]) == r["units"] == r["hard_tokens"] + r["soft_steps"] == len(r["p_soft"])
        assert r["soft_steps"] == r["actions"].count("s")
    assert sum(r["soft_steps"] for r in rows) > 0  # the router of b0 [-4.6, 0] goes soft: the mixtures were fed
    again = run_cli(capsys, soft_run, "--prompt", "1 + 1 =", "--prompt", "2 + 2 =", "--n", "2", "--json")[1]
    assert again == out  # exact: the same seed, kernels and shapes decide the same samples
    status, shown, _ = run_cli(capsys, soft_run, "--prompt", "1 + 1 =", "--show-soft")
    assert status == 0 and shown.startswith("--- prompt 0, sample 0, ") and "soft of" in shown and "⟦" in shown


def test_hard_inference_of_the_same_model_has_no_soft_step(soft_run):
    outs = generate(str(soft_run / "model"), ["1 + 1 =", "3 + 4 ="], adapter=str(soft_run / "adapter"), mode="hard",
                    n=2, max_new_tokens=8)
    assert len(outs) == 4 and all(o["soft_steps"] == 0 and "⟦" not in o["marked"] for o in outs)  # exact: counts


def test_a_kind_wraps_each_prompt_in_its_chat_prompt_and_bad_input_is_refused_before_loading(soft_run, capsys,
                                                                                            tmp_path):
    status, _, err = run_cli(capsys, soft_run)
    assert status == 2 and "no prompt: give --prompt TEXT or --prompts-file FILE" in err
    status, _, err = run_cli(capsys, soft_run, "--prompt", "x", "--kind", "poetry")
    assert status == 2 and "kind 'poetry': not a prompt kind (arith," in err
    status, _, err = cli(["generate", "--model", str(soft_run / "model"), "--adapter", str(tmp_path), "--prompt",
                          "x"]), *capsys.readouterr()
    assert status == 2 and "no adapter_config.json there" in err
    with pytest.raises(ValueError, match="kind 'poetry': not a prompt kind"):  # before the model (there is none)
        generate(str(tmp_path / "no-model"), ["x"], mode="cot", kind="poetry")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("1 + 1 =\n\n2 + 3 =\n")
    status, out, _ = run_cli(capsys, soft_run, "--prompts-file", str(prompts), "--kind", "arith", "--json")
    assert status == 0 and [json.loads(line)["prompt"] for line in out.splitlines()] == [0, 1]
