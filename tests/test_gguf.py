"""A ``.gguf`` file as MODEL (tarpo.models.gguf): each bad file is one line naming the setting and the file, before
any model loads and before anything is written; the preset's offline copy is what the preset then loads.

The files here are small GGUF headers written with the gguf package's own writer (a few tensors, no real model);
the real SmolLM2 file is converted and trained in tests/test_real_model.py."""

import os

import gguf
import numpy as np
import pytest

from tarpo.cli import main as cli
from tarpo.models import offline
from tarpo.models.gguf import check_gguf
from tarpo.runs import launch
from tarpo.runs.presets import resolve

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def write_gguf(path, arch="llama", chat_template=TEMPLATE, raw_dtype=None):
    """A GGUF file of two small tensors (the second one of ``raw_dtype``, given as raw bytes, if set)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_eos_token_id(2)
    if chat_template:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    if raw_dtype is None:
        w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    else:
        block, size = gguf.GGML_QUANT_SIZES[raw_dtype]
        w.add_tensor("blk.0.attn_q.weight", np.zeros((8, 256 // block * size), dtype=np.uint8), raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_a_sound_header_gives_its_facts(tmp_path):
    facts = check_gguf(write_gguf(tmp_path / "m.gguf", raw_dtype=gguf.GGMLQuantizationType.Q4_1), "MODEL")
    assert facts["architecture"] == "llama" and facts["types"] == ["F32", "Q4_1"]
    assert facts["eos"] == 2 and facts["chat_template"] == TEMPLATE


def bad_files(tmp_path):
    """(name, file, the message's words) of each bad input the issue names."""
    good = write_gguf(tmp_path / "good.gguf")
    data = open(good, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-100])
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(data[:40])
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(os.urandom(4096))
    return [
        ("cut short", str(cut), "corrupt or cut short (ValueError: cannot reshape"),
        ("truncated in its header", str(header_only), "corrupt or cut short"),
        ("not GGUF", str(noise), "not a readable GGUF file"),
        ("architecture", write_gguf(tmp_path / "phi.gguf", arch="phi3"),
         "architecture 'phi3': TARPO's rollout decodes llama and qwen2 models only"),
        ("tensor type", write_gguf(tmp_path / "tq.gguf", raw_dtype=gguf.GGMLQuantizationType.TQ1_0),
         "tensor type TQ1_0, which transformers cannot dequantise"),
        ("no chat template", write_gguf(tmp_path / "plain.gguf", chat_template=None),
         "no chat template (tokenizer.chat_template) in the file"),
    ]


def test_each_bad_file_is_one_line_from_the_launcher_before_anything_is_written(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    for name, path, words in bad_files(tmp_path):
        for var in ("MODEL", "DRY_RUN"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("OUT_DIR", str(tmp_path / "runs"))
        monkeypatch.setenv("MODEL", path)
        code = launch.main(["gsm8k"])
        err = capsys.readouterr().err.strip()
        assert code == 2, name
        assert err.count("\n") == 0 and err.startswith(f"tarpo launch: error: MODEL={path}: ") and words in err, err
        assert not (tmp_path / "runs").exists(), name  # no run folder, no cache (runs/cache) either


def test_tarpo_eval_and_case_refuse_a_bad_file_before_writing(tmp_path, capsys):
    bad = write_gguf(tmp_path / "plain.gguf", chat_template=None)
    code = cli(["eval", "--model", bad, "--tasks", "arith", "--limit", "2", "--n", "1", "--mode", "cot",
                "--out", str(tmp_path / "ev")])
    err = capsys.readouterr().err
    assert code == 2 and f"--model {bad}: no chat template" in err and not (tmp_path / "ev").exists()
    code = cli(["case", "--model", bad, "--task", "arith", "--ids", "arith-test-0", "--mode", "cot",
                "--out", str(tmp_path / "case.html")])
    err = capsys.readouterr().err
    assert code == 2 and f"--model {bad}: no chat template" in err and not (tmp_path / "case.html").exists()


def test_the_preset_loads_its_offline_copy_once_made_else_its_hub_id(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert resolve("gsm8k", {"MODEL": "smollm2-135m"}).model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    folder = tmp_path / offline.model_folder("smollm2-135m")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    cfg = resolve("gsm8k", {"MODEL": "smollm2-135m"})
    assert cfg.model == offline.model_folder("smollm2-135m") and cfg.preset == "smollm2-135m"


def test_the_offline_command_refuses_a_preset_no_package_ships(capsys):
    with pytest.raises(SystemExit):
        offline.main(["qwen2.5-3b"])  # argparse: not a choice
    assert "invalid choice" in capsys.readouterr().err


def test_a_preset_runs_identity_is_the_same_before_and_after_its_offline_copy_is_made(monkeypatch, tmp_path):
    """A run started on the preset's hub id and resumed once ``python -m tarpo.models.offline`` has made its folder
    is the same run (before: its identity named the hub id, then the folder, and the resumption was refused)."""
    from tarpo.runs.run_identity import identity

    monkeypatch.chdir(tmp_path)
    hub = resolve("gsm8k", {"MODEL": "smollm2-135m"})
    folder = tmp_path / offline.model_folder("smollm2-135m")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    local = resolve("gsm8k", {"MODEL": "smollm2-135m"})
    assert local.model != hub.model and identity(local) == identity(hub)
