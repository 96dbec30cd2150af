"""Bad input is caught before any model is loaded and before any file is written, and the error
names the variable, file, row or id, plus the smaller output rules (docs/design-notes.md, "Bad input
and small output rules")."""

import json
import os
import stat

import pytest

from tarpo.runs import launch
from tarpo.cli import main as cli
from tarpo.tasks.record_parsers import DataError
from tarpo.tasks.registry import load_task
from tarpo.models.tiny import char_tokenizer

LAUNCH_VARIABLES = ("MODEL", "ALGO", "SEED", "EVAL", "BETA", "DRY_RUN", "LR", "GROUP_SIZE", "BATCH", "EVAL_N")


def run_launcher(monkeypatch, tmp_path, capsys, **env):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OUT_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("MODEL", env.pop("MODEL", "/no/such/model/folder"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = launch.main(["gsm8k"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("env, message", [
    ({"LR": "-1"}, "LR=-1.0: must be >= 0"),
    ({"ROUTER_LR": "-0.1"}, "ROUTER_LR=-0.1: must be >= 0"),
    ({"EVAL": "1", "EVAL_N": "0"}, "EVAL_N=0: must be >= 1"),
    ({"GROUP_SIZE": "3", "BATCH": "8"}, "BATCH=8, GROUP_SIZE=3: generation_batch_size (8) must be divisible by "
                                        "num_generations (3)"),
    ({"GROUP_SIZE": "1", "BATCH": "8"}, "BATCH=8, GROUP_SIZE=1: GRPO requires at least 2 generations per prompt"),
    ({}, "MODEL='/no/such/model/folder': no such folder"),
    ({"DRY_RUN": "1"}, "MODEL='/no/such/model/folder': no such folder"),
])
def test_launcher_names_the_bad_variable_before_loading_or_writing(monkeypatch, tmp_path, capsys, env, message):
    if "MODEL" not in env and not message.startswith("MODEL"):
        env["MODEL"] = "qwen2.5-1.5b"  # a valid preset: only the named variable is wrong
    code, err = run_launcher(monkeypatch, tmp_path, capsys, **env)
    assert code == 2 and message in err, err
    assert not (tmp_path / "runs").exists()  # no run folder, no launch_config.json


@pytest.mark.parametrize("env, message", [
    ({"ACTION_BIAS": "inf,0"}, "ACTION_BIAS='inf,0': not a finite number"),
    ({"BETA": "nan"}, "BETA='nan': not a finite number"),
    ({"EPOCHS": "inf"}, "EPOCHS='inf': not a finite number"),
    ({"IS_CLIP_MAX": "inf"}, "IS_CLIP_MAX='inf': not a finite number (none: no bound)"),
    ({"MAX_STEPS": "-3"}, "MAX_STEPS=-3: must be >= 1 (leave it empty to train EPOCHS)"),
    ({"MAX_STEPS": "0"}, "MAX_STEPS=0: must be >= 1 (leave it empty to train EPOCHS)"),
    ({"SAVE_STEPS": "0"}, "SAVE_STEPS=0: must be >= 1 (a checkpoint every SAVE_STEPS optimizer steps)"),
    ({"BATCH": "0"}, "BATCH=0: must be >= 1 (completions per optimizer step)"),
    ({"BATCH": "-8"}, "BATCH=-8: must be >= 1 (completions per optimizer step)"),
    ({"GROUP_SIZE": "0"}, "GROUP_SIZE=0: must be >= 1 (completions per prompt)"),
])
def test_numbers_the_launcher_comments_do_not_allow_are_refused(monkeypatch, tmp_path, capsys, env, message):
    code, err = run_launcher(monkeypatch, tmp_path, capsys, MODEL="qwen2.5-1.5b", **env)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_an_out_dir_under_a_regular_file_is_refused(monkeypatch, tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("OUT_DIR", str(tmp_path / "file" / "runs"))
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODEL", "qwen2.5-1.5b")
    code, err = launch.main(["gsm8k"]), capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"OUT_DIR={tmp_path / 'file' / 'runs'}: {tmp_path / 'file'} exists and is not a folder" in err
    assert (tmp_path / "file").read_text() == "not a folder"


def test_an_out_dir_that_cannot_be_written_is_refused(monkeypatch, tmp_path, capsys):
    if os.geteuid() == 0:  # root writes anywhere: a read-only file system is what refuses it
        monkeypatch.setattr(os, "access", lambda path, mode, **k: False if mode & os.W_OK else True)
    else:
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(stat.S_IRUSR | stat.S_IXUSR)
    (tmp_path / "ro").mkdir(exist_ok=True)
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODEL", "qwen2.5-1.5b")
    monkeypatch.setenv("OUT_DIR", str(tmp_path / "ro" / "runs"))
    code, err = launch.main(["gsm8k"]), capsys.readouterr().err
    expected = f"OUT_DIR={tmp_path / 'ro' / 'runs'}: not writable (cannot create a folder in {tmp_path / 'ro'})"
    assert code == 2 and expected in err, err


@pytest.mark.parametrize("files, message", [
    ((), "no config.json: not a model folder"),
    (("config.json",), "no tokenizer (tokenizer.json, tokenizer.model or vocab.json)"),
])
def test_a_model_folder_without_a_model_says_so(monkeypatch, tmp_path, capsys, files, message):
    folder = tmp_path / "model"
    folder.mkdir()
    for name in files:
        (folder / name).write_text("{}")
    code, err = run_launcher(monkeypatch, tmp_path, capsys, MODEL=str(folder))
    assert code == 2 and f"MODEL={str(folder)!r}: {message}" in err and len(err.strip().splitlines()) == 1, err
    assert "sentencepiece" not in err and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("quantization", [
    {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    {"quant_method": "gptq", "bits": 4},
])
def test_a_quantized_model_folder_is_refused_before_loading(monkeypatch, tmp_path, capsys, quantization):
    """A pre-quantized checkpoint loads 4-bit whatever the launcher asks, and the rollout handed its packed
    weights to F.linear (a shape error at the prefill): refused before anything loads."""
    from tarpo.runs import training_run
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "quantization_config": quantization}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_text("")
    monkeypatch.setattr(training_run, "train", lambda *a, **k: pytest.fail("a quantized model was loaded"))
    code, err = run_launcher(monkeypatch, tmp_path, capsys, MODEL=str(folder))
    expected = f"MODEL={str(folder)!r}: a quantized model ({quantization['quant_method']}); TARPO trains LoRA"
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_a_model_folder_whose_config_is_not_json_is_named(monkeypatch, tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen2",')  # cut short
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_text("")
    code, err = run_launcher(monkeypatch, tmp_path, capsys, MODEL=str(folder))
    expected = f"MODEL={str(folder)!r}: {folder / 'config.json'} cannot be read as a model config"
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("hub_id", ["unsloth/Qwen2.5-3B-Instruct-bnb-4bit", "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
                                    "Qwen/Qwen2.5-7B-Instruct-AWQ"])
def test_a_quantized_hub_model_is_refused_before_loading(monkeypatch, tmp_path, capsys, hub_id):
    code, err = run_launcher(monkeypatch, tmp_path, capsys, MODEL=hub_id, DRY_RUN="1")
    assert code == 2 and f"MODEL={hub_id!r}: a quantized model" in err and "16-bit model" in err, err


def test_eval_refuses_a_quantized_model_before_loading(tmp_path, capsys):
    out = tmp_path / "eval"
    assert cli(["eval", "--model", "unsloth/Qwen2.5-3B-Instruct-bnb-4bit", "--tasks", "gsm8k", "--mode", "cot",
                "--out", str(out)]) == 2
    assert "--model unsloth/Qwen2.5-3B-Instruct-bnb-4bit: a quantized model (bnb-4bit)" in capsys.readouterr().err
    assert not out.exists()


def test_a_16_bit_hub_model_is_not_taken_for_a_quantized_one():
    from tarpo.models.quantized import check_not_quantized
    for hub_id in ("Qwen/Qwen2.5-3B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-Math-1.5B",
                   "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B"):
        check_not_quantized(hub_id, f"MODEL={hub_id}")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_non_utf8_data_names_file_and_row(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_bytes(b'{"question": "a", "answer": "#### 1"}\n{"question": "caf\xe9", "answer": "#### 2"}\n')
    with pytest.raises(DataError, match=r"test\.jsonl: row 2: not UTF-8 \(byte 0xe9 at column 18\)"):
        load_task("gsm8k", str(path))


def test_duplicate_example_ids_are_refused_naming_them(tmp_path):
    rows = [{"problem": f"q{i}", "answer": str(i), "unique_id": f"id{i % 2}"} for i in range(4)]
    path = write_jsonl(tmp_path / "test.jsonl", rows)
    with pytest.raises(DataError, match=r"2 duplicate example id\(s\): id 'id0' at .*row 1, .*row 3; id 'id1'"):
        load_task("math500", path)


def test_eval_refuses_an_unwritable_out_before_loading_and_creates_nothing_on_bad_data(tmp_path, capsys):
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    write_jsonl(data / "test.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    base = ["eval", "--model", "/no/such/model", "--tasks", "gsm8k", "--data-dir", str(tmp_path / "data"),
            "--mode", "cot", "--n", "1"]
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert cli(base + ["--out", str(blocker / "eval")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    (data / "test.jsonl").write_bytes(b"\xff\n")
    assert cli(base + ["--out", str(tmp_path / "new-out")]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    assert not (tmp_path / "new-out").exists()


def test_grade_names_a_line_it_could_not_write_and_writes_as_it_grades(tmp_path, capsys, monkeypatch):
    import tarpo.cli.grade as grade
    good = {"completion": "#### 2", "gold": "2"}
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(good) + "\n" + '{"completion": "#### \\ud800", "gold": "2"}\n')
    out = tmp_path / "out.jsonl"
    assert cli(["grade", "--task", "gsm8k", str(src), "--out", str(out)]) == 2
    assert "in.jsonl: line 2: text that cannot be written as UTF-8" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "out.jsonl.partial").exists()

    src.write_text("".join(json.dumps({**good, "i": i}) + "\n" for i in range(5)))
    monkeypatch.setattr(grade, "CHUNK", 2)
    real, calls = grade.grade_batch, []

    def dies_on_third_chunk(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a kill while grading
        return real(*a, **k)
    monkeypatch.setattr(grade, "grade_batch", dies_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        cli(["grade", "--task", "gsm8k", str(src), "--out", str(out), "--workers", "1"])
    kept = [json.loads(x) for x in (tmp_path / "out.jsonl.partial").read_text().splitlines()]
    assert [r["i"] for r in kept] == [0, 1, 2, 3] and all(r["score"] == 1.0 for r in kept)
    assert not out.exists()


def test_a_long_chat_prompt_keeps_its_system_prompt_and_template():
    from tarpo.tasks.prompts import encode_prompts
    tok = char_tokenizer()
    system = {"role": "system", "content": "SYSTEM RULES"}
    prompt = [system, {"role": "user", "content": "BEGIN " + "x" * 300 + " end"}]
    ids, mask, n = encode_prompts(tok, [prompt], max_length=80)
    text = tok.decode(ids[0][mask[0].bool()])
    assert n == 1 and mask.sum() <= 80
    assert "SYSTEM RULES" in text and text.endswith("end<|im_end|>\n<|im_start|>assistant\n")
    assert "BEGIN" not in text
    with pytest.raises(ValueError, match="prompt of row 0: even with an empty last user turn"):
        encode_prompts(tok, [[{"role": "system", "content": "S" * 200}, {"role": "user", "content": "q"}]], 40)


def test_the_trainer_says_how_many_prompts_will_be_cut_at_the_start(tmp_path, caplog):
    import datasets

    from tarpo.models.tiny import tiny_causal_lm
    from tarpo.training.trainer import TarpoTrainer
    from test_trainer import letter_reward, make_args
    tok = char_tokenizer()
    rows = [{"prompt": [{"role": "user", "content": "q" * (200 if i < 3 else 5)}]} for i in range(8)]
    with caplog.at_level("WARNING", logger="tarpo.training.trainer"):
        TarpoTrainer(model=tiny_causal_lm(tok), reward_funcs=letter_reward, processing_class=tok,
                     args=make_args(tmp_path, max_prompt_length=64), train_dataset=datasets.Dataset.from_list(rows))
    assert "3 of 8 training prompts are longer than max_prompt_length=64" in caplog.text


def test_results_and_settings_get_the_users_umask(tmp_path):
    from tarpo.atomic_files import write_json_atomic
    old = os.umask(0o022)
    try:
        write_json_atomic(str(tmp_path / "r.json"), {"a": 1})
        (tmp_path / "t.jsonl").write_text("")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "r.json").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "t.jsonl").st_mode) == 0o644


def test_launcher_refuses_a_prompt_that_cannot_fit_before_loading_the_model(monkeypatch, tmp_path, capsys):
    from tarpo.models.tiny import tiny_causal_lm
    tok = char_tokenizer()
    tiny_causal_lm(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    data = write_jsonl(tmp_path / "train.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    loads = []
    # patched where the launch calls it (before: tarpo.models.loading's, which the launch never looks up there)
    monkeypatch.setattr("tarpo.runs.training_run.training_policy", lambda *a, **k: loads.append(1))
    code, err = run_launcher(monkeypatch, tmp_path, capsys, MODEL=str(tmp_path / "tiny"), DATA_PATH=data,
                             MAX_PROMPT_LENGTH="32", BF16="0")
    assert code == 2 and "prompt of row 0: even with an empty last user turn" in err, err
    assert loads == [] and not (tmp_path / "runs").exists()


def test_eval_refuses_a_read_only_out_before_loading(tmp_path, capsys, monkeypatch):
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    write_jsonl(data / "test.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    if os.geteuid() == 0:  # root writes into a 0555 folder: stand in for a read-only file system
        import tempfile

        def refuse(*a, **k):
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    args = ["eval", "--model", "/no/such/model", "--tasks", "gsm8k", "--data-dir", str(tmp_path / "data"),
            "--mode", "cot", "--n", "1", "--out", str(out)]
    assert cli(args) == 2
    assert f"--out {out}: not writable (Permission denied)" in capsys.readouterr().err
    assert list(out.iterdir()) == []
