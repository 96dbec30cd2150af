import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from checkout import use_checkout_patches  # noqa: E402

use_checkout_patches()  # before anything imports tarpo.patches (tests/checkout.py)

import pytest  # noqa: E402
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

from tarpo.router import Router  # noqa: E402
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


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """For the ``tarpo eval`` tests: a saved random Qwen2 + char tokenizer, and an adapter folder with
    a 50/50 router."""
    root = tmp_path_factory.mktemp("tiny")
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, "qwen2", seed=0)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    peft.save_pretrained(root / "adapter")
    Router(model.config.hidden_size, bias=(0.0, 0.0)).save(str(root / "adapter"))
    return str(root / "model"), str(root / "adapter")


@pytest.fixture(autouse=True)
def _unsloth_stays_out_of_this_process():
    """Importing Unsloth rebinds transformers' Qwen2/Llama forwards and its checkpoint function for
    the whole process, so every later test would run Unsloth's code: a test that needs Unsloth
    runs it in a subprocess (tests/backend_worker.py)."""
    import sys
    yield
    assert "unsloth" not in sys.modules, "a test imported unsloth into the pytest process; use a subprocess"
