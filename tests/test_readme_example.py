"""The README's Python example runs as printed, on the tiny model instead of the hub's and at a tiny size: it trains,
saves the adapter with its router, and samples the trained model through the hybrid decoder."""

import os
import re

from tarpo.models.tiny import char_tokenizer, tiny_causal_lm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALLER = {'MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"': None, "max_steps=30": "max_steps=1",
           "num_generations=8, per_device_train_batch_size=8": "num_generations=4, per_device_train_batch_size=4",
           "max_completion_length=64": "max_completion_length=8", "max_new_tokens=64": "max_new_tokens=8"}


def test_the_readmes_python_example_runs(tmp_path, monkeypatch, capsys):
    readme = open(os.path.join(ROOT, "README.md")).read()
    code = re.search(r"```python\n(.*?)```", readme[readme.index("## From Python"):], flags=re.S).group(1)
    tok = char_tokenizer()
    tiny_causal_lm(tok, "qwen2", seed=0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    for old, new in SMALLER.items():
        assert old in code, old  # the example still says what this test shrinks
        code = code.replace(old, new or f"MODEL = {str(tmp_path / 'model')!r}")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    assert (tmp_path / "runs" / "my-tarpo" / "adapter" / "router.safetensors").is_file()
    marked, soft_steps = capsys.readouterr().out.strip().rsplit(" ", 1)
    assert soft_steps.isdigit()
