import gc
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from checkout import use_checkout_patches  # noqa: E402

use_checkout_patches()  # before anything imports tarpo.patches (tests/checkout.py)

import pytest  # noqa: E402
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

from tarpo.engine.router import Router  # noqa: E402
from tarpo.models.tiny import char_tokenizer, tiny_causal_lm  # noqa: E402

# pytest-xdist's workers share the cores (scripts/test.sh runs one per core), and so do the processes a test starts:
# they inherit the worker's share. With a thread per core beside the other worker's tests, OpenMP's threads waited on
# each other: measured on 2 cores, a warm suite, the Unsloth trainer's fixture took 258 s (46 s alone) and the
# checkpoints' 164 s; with the share, 65 s and 21 s, and the suite 655 -> 473 s. A test may still set its own.
THREADS = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
torch.set_num_threads(THREADS)
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(THREADS)


# pytest-xdist (scripts/test.sh): a test module runs in one worker, which builds its module-scoped fixtures
# once, except these, whose tests are independent and long (compiles), and go one by one to any worker;
# the modules that start processes on gloo (accelerate's default port) run in one worker, in turn.
SPREAD = {"test_static_decode.py", "test_baselines.py", "test_trainer.py", "test_rollout.py", "test_microbatch.py"}
GLOO = {"test_ddp.py", "test_eval_parallel.py"}


# The scopes in the order the workers take them, the longest first (measured 2026-11-27 on 2 cores, a warm suite,
# `--durations=0` summed by module: FSDP 138 s, the gloo scope 79 s, the demo 69 s, the memory plan 68 s, the Unsloth
# trainer 65 s, ...; 920 s of tests in 470 s on two workers): pytest-xdist deals scopes first come, first served, and a
# long module dealt last leaves the other worker idle until it ends. The rest keep their collection order.
LONGEST_FIRST = ("test_fsdp.py", "test_ddp.py", "test_eval_parallel.py", "test_demo.py", "test_memory_plan.py",
                 "test_unsloth_trainer.py", "test_unsloth_cpu.py", "test_graders.py", "test_gpu_session.py",
                 "test_torch_side.py", "test_launch.py", "test_checkpoints.py", "test_kernel_settings.py",
                 "test_static_decode.py", "test_backend_worker.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(item.nodeid.split("::", 1)[0]), len(rank)))


def pytest_collection_finish(session):
    """What the imports and the collection made is never garbage: frozen (``gc.freeze``), it is left out of
    every later collection, automatic or a test's ``gc.collect()``, each of which would walk it again."""
    gc.freeze()


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the collection's order (LONGEST_FIRST), not the scopes' test counts

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            name = os.path.basename(path)
            return "gloo" if name in GLOO else nodeid if name in SPREAD else path

    return Scheduling(config, log)


@pytest.fixture(autouse=True)
def _compile_backend(request, monkeypatch):
    """The compiled engine is traced by dynamo with ``fullgraph=True`` in every test, so a graph break
    or a recompile fails wherever it happens; inductor's C++ code generation (about a minute a graph
    on a cold cache) runs only in the tests marked ``inductor``, which compare it with the eager
    engine. The others lower the same traced graph with ``aot_eager`` (tarpo/engine/static_decode.py)."""
    from tarpo.engine.static_decode import COMPILE_BACKEND_VARIABLE
    if request.node.get_closest_marker("inductor") is None:
        monkeypatch.setenv(COMPILE_BACKEND_VARIABLE, "aot_eager")
    else:
        monkeypatch.delenv(COMPILE_BACKEND_VARIABLE, raising=False)


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
    runs it in a subprocess (tests/workers/backend_worker.py)."""
    import sys
    yield
    assert "unsloth" not in sys.modules, "a test imported unsloth into the pytest process; use a subprocess"
