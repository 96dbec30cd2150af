import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from tarpo.tiny import char_tokenizer, tiny_causal_lm  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tokenizer():
    return char_tokenizer()


@pytest.fixture(params=["qwen2", "llama"])
def arch(request):
    return request.param


@pytest.fixture
def model(tokenizer, arch):
    return tiny_causal_lm(tokenizer, arch, seed={"qwen2": 0, "llama": 1}[arch])


@pytest.fixture(autouse=True)
def _unsloth_stays_out_of_this_process():
    """Importing Unsloth rebinds transformers' Qwen2/Llama forwards and its checkpoint function for
    the whole process, so every later test would run Unsloth's code: a test that needs Unsloth
    runs it in a subprocess (tests/backend_worker.py)."""
    import sys
    yield
    assert "unsloth" not in sys.modules, "a test imported unsloth into the pytest process; use a subprocess"
