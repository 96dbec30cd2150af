"""The memory plan (tarpo.engine.memory_plan, docs/memory-plan.md): exact parameter counts, the formula against
live-storage peaks measured on this project's own rollout and training code, the launcher's micro-batch."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tarpo.engine import memory_plan as mp
from tarpo.engine.backbone import Backbone
from tarpo.engine.precision import mixed_precision
from tarpo.runs.presets import DATASETS, MODELS
from tarpo.models.tiny import char_tokenizer, synthetic_rollout, tiny_causal_lm
from helpers import free_port
from workers.live_storage import LiveStorage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
TOLERANCE = 0.15  # |measured - planned| / planned, for the activation terms
ONE_GPU = ["qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "llama3.1-8b"]  # the paper's models, each run on one GPU
# docs/several-gpus.md's table: the fewest 80 GB GPUs that the larger presets need under FSDP2 (configs/fsdp2.yaml)
SHARDED = {("qwen2.5-14b", "gsm8k"): 1, ("qwen2.5-14b", "math"): 1, ("qwen2.5-14b", "dapo"): 1,
           ("qwen2.5-32b", "gsm8k"): 8, ("qwen2.5-32b", "math"): 8, ("qwen2.5-32b", "dapo"): 16}


def tiny(arch, d, inter, layers, heads, kv, vocab, tied=False):
    return tiny_causal_lm(char_tokenizer(), arch, hidden_size=d, layers=layers, heads=heads, kv_heads=kv,
                          intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=tied)


@pytest.mark.parametrize("arch, tied", [("qwen2", True), ("qwen2", False), ("llama", False)])
def test_parameter_counts_are_the_real_models(arch, tied):
    model = tiny(arch, 64, 160, 3, 4, 2, 300, tied)
    s = mp.shapes_of(model.config, ATTENTION, 8)
    assert s.params == sum(p.numel() for p in model.parameters())
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=ATTENTION))
    assert s.lora_params == sum(p.numel() for p in peft.parameters() if p.requires_grad)


def test_the_presets_are_the_published_architectures():
    """Parameter counts of the model cards: 1.54B, 3.09B, 7.61B, 14.7B, 32.8B (Qwen2.5), 8.03B (Llama 3.1)."""
    counts = {m: mp.shapes_of(mp.preset_config(m), ATTENTION, 32).params for m in MODELS}
    assert counts["llama3.1-8b"] == 8_030_261_248
    for m, billions in {"qwen2.5-1.5b": 1.54, "qwen2.5-3b": 3.09, "qwen2.5-7b": 7.61, "qwen2.5-14b": 14.77,
                        "qwen2.5-32b": 32.76}.items():
        assert abs(counts[m] / 1e9 - billions) < 0.01, (m, counts[m])


# (arch, d, intermediate, layers, heads, kv heads, vocab, micro-batch, prompt, completion): the second is
# dominated by a log-prob chunk (vocabulary 4096), the first by a recomputed layer
TRAIN_CASES = [("qwen2", 256, 896, 4, 8, 2, 256, 4, 64, 192), ("llama", 128, 352, 6, 4, 2, 4096, 4, 32, 160)]


@pytest.mark.parametrize("case", TRAIN_CASES, ids=["qwen2-layer", "llama-chunk"])
def test_training_activations_match_a_measured_peak(case):
    """A micro-batch's forward (policy + reference, router, chunked log-probs) and backward through
    LoRA with non-reentrant gradient checkpointing, bf16 weights under the trainer's autocast
    (:func:`tarpo.engine.precision.mixed_precision`), as the trainer runs it."""
    from tarpo.engine.router import Router
    from tarpo.engine.soft_input import TOP_K_MIXTURE
    from tarpo.training.scoring import ScoreSettings, score_rollout

    arch, d, inter, layers, heads, kv, vocab, mb, P, T = case
    model = tiny(arch, d, inter, layers, heads, kv, vocab).to(torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=ATTENTION))
    model.train()
    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    router = Router(d, bias=[4.6, 0.0], init_std=1e-3)
    rollout = synthetic_rollout(vocab, mb, P, T, 4, "cpu")
    rollout.prompt_mask[:, :5] = 0  # left padding: the attention mask is materialised, as in training
    rollout.is_soft = rollout.decided.clone()  # every thinking step soft (Pure Latent): the plan's bound
    mode = LiveStorage()
    backbone = Backbone(model)
    with mode, mixed_precision(backbone):  # the trainer's precision (tests/test_gpu_path.py checks it uses this)
        s = score_rollout(backbone, router, router.frozen_copy(), rollout,
                          ScoreSettings(temperature=0.5, chunk_size=1024, use_router=True, with_reference=True),
                          TOP_K_MIXTURE)
        (s.logp_tok.sum() + s.logp_act.sum() + s.kl_tok.sum() + s.kl_act.sum()).backward()
    shapes = mp.shapes_of(model.config, ATTENTION, 8)
    parts = mp.train_bytes(shapes, mp.Run(rows=mb, prompt=P, completion=T, soft_top_k=4), mb)
    planned = parts["activations"] + parts["gradients"]
    print(f"measured {mode.peak} planned {planned} ratio {mode.peak / planned:.3f}")
    assert abs(mode.peak - planned) <= TOLERANCE * planned, (mode.peak, planned)


# (vocab, rows, prompt, new tokens): a prefill-dominated rollout, and one dominated by a decode step's
# vocabulary-sized temporaries
ROLLOUT_CASES = [(512, 8, 128, 48), (65536, 16, 8, 8)]


@pytest.mark.parametrize("case", ROLLOUT_CASES, ids=["prefill", "decode-step"])
def test_eager_rollout_matches_a_measured_peak(case):
    from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate
    from tarpo.engine.soft_input import TOP_K_MIXTURE
    from tarpo.engine.router import Router

    vocab, B, P, T = case
    model = tiny("qwen2", 128, 448, 3, 4, 2, vocab).to(torch.bfloat16)
    ids = torch.randint(10, vocab, (B, P))
    mask = torch.ones(B, P, dtype=torch.long)
    mask[:, :3] = 0
    spec = RolloutSpec(max_new_tokens=T, engine="eager", answer_tag="@@@@")  # no EOS, no tag: every row runs T steps
    mode = LiveStorage()
    backbone = Backbone(model)
    with mode, mixed_precision(backbone):  # as the trainer rolls out
        policy = Policy(backbone, lambda i: "x", [], 0, Router(128, bias=[0.0, 0.0]), TOP_K_MIXTURE)
        out = hybrid_generate(policy, ids, mask, spec, noise_seed=1)
    assert out.token_ids.shape == (B, T)
    run = mp.Run(rows=B, prompt=P, completion=T, engine="eager")
    s = mp.shapes_of(model.config, ATTENTION, 8)
    parts = mp.rollout_bytes(s, run)
    # a lone call holds no earlier step's records, no weights or optimizer state of its own
    planned = sum(parts.values()) - parts["weights"] - parts["adapter+optimizer"] - mp.records_bytes(s, run)
    print(f"measured {mode.peak} planned {planned} ratio {mode.peak / planned:.3f}")
    assert abs(mode.peak - planned) <= TOLERANCE * planned, (mode.peak, planned)


def test_the_compiled_engine_cache_is_the_planned_kv_cache():
    """The cache that tarpo.engine.static_decode allocates (functional_decoder.new_cache), after a prefill:
    B x bucketed length x layers x K, V."""
    from tarpo.engine import decoder_tensors, functional_decoder as fd
    from tarpo.engine.backbone import positions_from_mask
    from tarpo.engine.static_decode import DecodeBuffers

    model = tiny("llama", 64, 160, 3, 4, 2, 300).to(torch.bfloat16)
    run = mp.Run(rows=4, prompt=40, completion=50, engine="compiled")
    assert mp.cache_positions(run) == 128  # 90 rounded up to the bucket of 64
    backbone, weights = Backbone(model), decoder_tensors.build(model)
    ctx = SimpleNamespace(backbone=backbone, spec=SimpleNamespace(max_new_tokens=50, soft_top_k=4), mixture_width=0,
                          pad_token_id=0)
    cache = DecodeBuffers(ctx, weights, 4, mp.cache_positions(run), "cpu").cache
    mask = torch.ones(4, 40, dtype=torch.long)
    with torch.no_grad():
        fd.forward(weights, backbone.embed_weight[torch.randint(3, 300, (4, 40))], positions_from_mask(mask), cache,
                   torch.arange(40), fd.prefill_mask(mask), 40)
    allocated = sum(t.numel() * t.element_size() for kv in cache for t in kv)
    assert allocated == mp.rollout_bytes(mp.shapes_of(model.config, ATTENTION, 8), run)["kv_cache"]


def decode_tensors(layer):
    """Every tensor of a decoder_tensors.Layer's projections (norms aside)."""
    for part in (layer.qkv, layer.o, layer.gate_up, layer.down):
        projections, groups = (part.projections, part.lora) if hasattr(part, "sizes") else ((part,), ())
        for p in projections:
            yield from (t for t in (p.weight, p.bias) if t is not None)
            yield from (t for a, b, bb, _ in p.lora for t in (a, b, bb) if t is not None)
        yield from (t for a, b, bb, _ in groups for t in (a, b, bb) if torch.is_tensor(t))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_compiled_engines_decode_weights_are_planned(dtype):
    """The copies the compiled engine makes per rollout (decoder_tensors.build: merged q|k|v, o, gate|up,
    down with their biases; or the adapter's grouped and cast LoRA) are the plan's ``decode_weights`` bytes, exactly,
    at every merge level, for Qwen2 (q/k/v biases) and Llama, three sets of LoRA targets, fp32 and bf16 weights
    (fp32 LoRA, as PEFT keeps it)."""
    from peft import LoraConfig, get_peft_model

    from tarpo.engine import decoder_tensors

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for arch in ("qwen2", "llama"):
        for lora_targets in (targets, ATTENTION, ["q_proj", "v_proj"]):
            model = get_peft_model(tiny(arch, 64, 160, 3, 4, 2, 300).to(dtype), LoraConfig(r=8,
                                                                                            target_modules=lora_targets))
            assert next(p for n, p in model.named_parameters() if "lora_A" in n).dtype == torch.float32
            own = {p.data_ptr() for p in model.parameters()}
            shapes = mp.shapes_of(model.config, lora_targets, 8)
            for merge in ("all", "attention", "none"):
                weights = decoder_tensors.build(model, merge)
                copies = {t.data_ptr(): t for layer in weights.layers for t in decode_tensors(layer)
                          if t.data_ptr() not in own}
                made = sum(t.numel() * t.element_size() for t in copies.values())
                run = mp.Run(rows=1, prompt=8, completion=8, decode_merge=merge, weight_bytes=dtype.itemsize)
                assert made == mp.rollout_bytes(shapes, run)["decode_weights"], (arch, lora_targets, merge)
                assert made > 0 or (merge == "none" and dtype == torch.float32 and len(lora_targets) == 2)


# a sharded run's per-process plan: 8 decoder layers, so that gathering 2 of them is told apart from the whole
SHARDED_RUN = dict(d=256, inter=1024, layers=8, heads=4, kv=2, vocab=1024, r=8, rows=4, prompt=16, completion=16, k=4)


@pytest.mark.parametrize("processes", [2, 4])
def test_a_sharded_run_matches_the_measured_peaks_of_every_process(tmp_path, processes):
    """FSDP2 on gloo, sharded by accelerate as configs/fsdp2.yaml shards (tests/workers/fsdp_memory_worker.py):
    every tensor byte a process holds at the peak of its second step's rollout (the whole model gathered
    beside its shards) and of its training forward/backward (embedding, head and the running layers
    gathered; LoRA gradients and AdamW state sharded), against the plan's total per process. The plan of the
    same run unsharded misses both by more than the tolerance: the comparison sees the sharded terms."""
    c = SHARDED_RUN
    worker = os.path.join(ROOT, "tests", "workers", "fsdp_memory_worker.py")
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, worker, str(tmp_path), json.dumps(c)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(processes),
                                   "LOCAL_WORLD_SIZE": str(processes), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": port, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
             for r in range(processes)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    model = tiny("qwen2", c["d"], c["inter"], c["layers"], c["heads"], c["kv"], c["vocab"])
    s = mp.shapes_of(model.config, ATTENTION, c["r"])
    run = mp.Run(rows=c["rows"], prompt=c["prompt"], completion=c["completion"], engine="eager", soft_top_k=c["k"],
                 optim_8bit=False, shards=processes)  # AdamW in fp32: the optimizer of a sharded run (runs.presets)

    def planned(run):  # a lone rollout call holds no earlier step's records (as the one-process measurement)
        return {"rollout": sum(mp.rollout_bytes(s, run).values()) - mp.records_bytes(s, run),
                "train": sum(mp.train_bytes(s, run, c["rows"]).values())}
    sharded, whole = planned(run), planned(mp.Run(**{**run.__dict__, "shards": 1}))
    for rank in range(processes):
        measured = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for phase in ("rollout", "train"):
            print(f"rank {rank} {phase}: measured {measured[phase]} planned {sharded[phase]:.0f} "
                  f"ratio {measured[phase] / sharded[phase]:.3f} "
                  f"(unsharded plan {measured[phase] / whole[phase]:.3f})")
            assert abs(measured[phase] - sharded[phase]) <= TOLERANCE * sharded[phase], (rank, phase)
            assert abs(measured[phase] - whole[phase]) > TOLERANCE * whole[phase], (rank, phase)


def run_launcher(monkeypatch, capsys, dataset, **env):
    """``python -m tarpo.runs.launch <dataset>`` in this process; returns (status, stdout, stderr)."""
    from tarpo.runs import launch
    for name in ("MODEL", "ALGO", "BATCH", "MICRO_BATCH", "NUM_PROCESSES", "ACCELERATE_CONFIG", "BACKEND"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    status = launch.main([dataset])
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.mark.parametrize("backend", ["hf", "unsloth"])
def test_every_preset_plans_within_an_80_gb_gpu(monkeypatch, capsys, backend):
    """Before this change the configuration had no memory_plan and trained each step's 64 completions in one
    micro-batch: 86 GiB planned for Qwen2.5-7B on MATH, 140 GiB for Llama-3.1-8B on DAPO."""
    import tarpo.models.loading
    monkeypatch.setattr(tarpo.models.loading, "resolve_backend", lambda b="auto": backend)  # unsloth needs CUDA
    table = {}
    for model in ONE_GPU:
        for dataset in DATASETS:
            status, out, err = run_launcher(monkeypatch, capsys, dataset, MODEL=model, DRY_RUN="1", BACKEND=backend)
            assert status == 0, err
            cfg = json.loads(out.strip().splitlines()[-1])
            plan, t = cfg["memory_plan"], cfg["trainer"]
            table[model, dataset] = plan["micro_batch"]
            assert plan["peak_gib"] <= 76 and plan["usable_gib"] <= 76 and plan["fits"]
            assert plan["engine"] == "compiled"  # on a GPU, whichever backend (tarpo.engine.functional_decoder)
            batch = DATASETS[dataset]["per_device_train_batch_size"]
            assert t["per_device_train_batch_size"] == plan["micro_batch"] and batch % plan["micro_batch"] == 0
            assert t["per_device_train_batch_size"] * t["gradient_accumulation_steps"] == batch
            assert f"-bs{batch}-" in cfg["run_dir"]  # the run folder keeps its name: old runs resume
    if backend == "hf":  # the large runs are split; the small ones are not
        assert table["qwen2.5-7b", "math"] < 64 and table["llama3.1-8b", "dapo"] < 64
        assert table["qwen2.5-1.5b", "gsm8k"] == 32


def test_the_larger_presets_fit_the_fewest_80_gb_gpus_of_the_docs_table(monkeypatch, capsys):
    """FSDP2 (configs/fsdp2.yaml) on docs/several-gpus.md's number of GPUs fits each data set; half as many does not.
    The refusal names NUM_PROCESSES (the acceptance line: Qwen2.5-32B on MATH, 8 GPUs and 1)."""
    config = os.path.join(ROOT, "configs", "fsdp2.yaml")
    readme = open(os.path.join(ROOT, "docs", "several-gpus.md")).read()
    for (model, dataset), gpus in SHARDED.items():
        assert f"| `{model}` | {dataset} | {gpus} |" in readme, (model, dataset)
        status, out, err = run_launcher(monkeypatch, capsys, dataset, MODEL=model, DRY_RUN="1",
                                        ACCELERATE_CONFIG=config, NUM_PROCESSES=str(gpus))
        assert status == 0, err
        plan = json.loads(out.strip().splitlines()[-1])["memory_plan"]
        assert plan["fits"] and plan["peak_gib"] <= plan["usable_gib"] and plan["shards"] == gpus
        if gpus > 1:
            status, out, err = run_launcher(monkeypatch, capsys, dataset, MODEL=model, DRY_RUN="1",
                                            ACCELERATE_CONFIG=config, NUM_PROCESSES=str(gpus // 2))
            assert status == 2 and "raise NUM_PROCESSES" in err, (model, dataset, err)


def test_the_shell_launcher_prints_the_plan():
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "BATCH", "MICRO_BATCH", "NUM_PROCESSES")}
    res = subprocess.run(["bash", os.path.join(ROOT, "run_dapo.sh")], capture_output=True, text=True, timeout=300,
                         env={**env, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", "DRY_RUN": "1",
                              "MODEL": "llama3.1-8b"})
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout.strip().splitlines()[-1])["memory_plan"]
    assert {"rollout_gib", "train_gib", "peak_gib", "micro_batch", "gpu_gib"} <= set(plan)
    assert plan["micro_batch"] == 32 and plan["gradient_accumulation_steps"] == 2


def fake_gpu(monkeypatch, gib):
    """CUDA with a GPU of ``gib`` GiB, as the launcher's checks and plan see it; the run's TarpoConfig is built as on
    a CPU (transformers would set up the CUDA device it sees)."""
    from tarpo.runs import run_config
    build = run_config.trainer_arguments
    monkeypatch.setattr(run_config, "trainer_arguments",
                        lambda cfg, cuda, whole_step=False: build(cfg, False, whole_step))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(gib * mp.GIB), int(gib * mp.GIB)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: f"fake {gib} GiB")


def test_without_bitsandbytes_the_plan_counts_the_moments_training_keeps(monkeypatch, capsys):
    """TarpoConfig trains adamw_torch where bitsandbytes cannot load (tarpo.config.resolve_optimizer): the plan
    counts its 8-byte moments, from the validated configuration (before: 2-byte 8-bit ones, from the raw OPTIM)."""
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` raises, as where it is missing
    status, out, err = run_launcher(monkeypatch, capsys, "math", MODEL="qwen2.5-3b", DRY_RUN="1")
    assert status == 0, err
    plan = json.loads(out.strip().splitlines()[-1])["memory_plan"]
    s = mp.shapes_of(mp.preset_config("qwen2.5-3b"), ATTENTION, 32)
    run = mp.Run(rows=64, prompt=1024, completion=1024, decode_merge=plan["decode_merge"])
    fp32 = mp.plan(s, replace(run, optim_8bit=False), plan["micro_batch"])
    eight = mp.plan(s, run, plan["micro_batch"])
    assert round(fp32["peak_gib"], 2) == plan["peak_gib"] != round(eight["peak_gib"], 2)


def test_the_largest_micro_batch_that_fits_the_visible_gpu(monkeypatch, capsys):
    fake_gpu(monkeypatch, 40)
    status, out, err = run_launcher(monkeypatch, capsys, "math", MODEL="qwen2.5-3b", DRY_RUN="1")
    assert status == 0, err
    plan = json.loads(out.strip().splitlines()[-1])["memory_plan"]
    assert plan["gpu_gib"] == 40 and plan["usable_gib"] == 38.4
    s = mp.shapes_of(mp.preset_config("qwen2.5-3b"), ATTENTION, 32)
    run = mp.Run(rows=64, prompt=1024, completion=1024)
    assert (mp.plan(s, run, plan["micro_batch"])["peak_gib"] <= 38.4
            < mp.plan(s, run, 2 * plan["micro_batch"])["peak_gib"])


@pytest.mark.parametrize("env, message", [
    ({"MICRO_BATCH": "5"}, "MICRO_BATCH=5: must divide the completions each process trains per step, "
                           "BATCH/NUM_PROCESSES = 64/1 = 64"),
    ({"MICRO_BATCH": "0"}, "MICRO_BATCH=0: must be >= 1"), ({"MICRO_BATCH": "x"}, "MICRO_BATCH='x'"),
    ({"MICRO_BATCH": "64", "MODEL": "llama3.1-8b"}, "MICRO_BATCH: the run needs 116.1 GiB at MICRO_BATCH=64"),
    ({"BATCH": "1024", "MODEL": "llama3.1-8b"}, "BATCH: the run needs"),
])
def test_bad_micro_batches_are_refused_before_anything_loads(monkeypatch, capsys, tmp_path, env, message):
    from tarpo.runs import training_run
    fake_gpu(monkeypatch, 79.1)
    monkeypatch.setattr(training_run, "train", lambda *a, **k: pytest.fail("the model was loaded"))
    status, out, err = run_launcher(monkeypatch, capsys, "dapo", OUT_DIR=str(tmp_path / "runs"), **env)
    assert status == 2 and message in err
    if "needs" in message:
        assert "MAX_COMPLETION_LENGTH or MODEL" in err
    assert not (tmp_path / "runs").exists()


def test_a_hub_id_without_a_cached_config_skips_the_plan(monkeypatch, capsys):
    status, out, err = run_launcher(monkeypatch, capsys, "gsm8k", MODEL="nobody/no-such-model", DRY_RUN="1",
                                    MICRO_BATCH="8")
    assert status == 0, err
    cfg = json.loads(out.strip().splitlines()[-1])
    assert "memory not planned" in cfg["memory_plan"]["skipped"] and cfg["memory_plan"]["micro_batch"] == 8
    assert (cfg["trainer"]["per_device_train_batch_size"], cfg["trainer"]["gradient_accumulation_steps"]) == (8, 4)


def test_auto_decode_merge_takes_the_first_level_whose_rollout_fits():
    """DECODE_MERGE=auto: all where it fits, else attention, else none; a level that was set is kept as set. With
    the paper's targets (no LoRA in the MLP) all and attention copy the same weights."""
    run = mp.Run(rows=64, prompt=1024, completion=1024)
    levels = ("all", "attention", "none")
    paper = mp.shapes_of(mp.preset_config("qwen2.5-3b"), ATTENTION, 32)
    rollout = {m: sum(mp.rollout_bytes(paper, replace(run, decode_merge=m)).values()) for m in levels}
    assert rollout["all"] == rollout["attention"] > rollout["none"]
    s = mp.shapes_of(mp.preset_config("qwen2.5-3b"), [n for n, *_ in paper.projections], 32)
    rollout = {m: sum(mp.rollout_bytes(s, replace(run, decode_merge=m)).values()) for m in levels}
    assert rollout["all"] > rollout["attention"] > rollout["none"]
    for usable, chosen in ((rollout["all"], "all"), (rollout["all"] - 1, "attention"),
                           (rollout["attention"] - 1, "none"), (1, "none")):
        assert mp.choose_decode_merge(s, run, usable) == chosen
    assert mp.choose_decode_merge(s, run, 1, "all") == "all"
    assert mp.choose_decode_merge(s, replace(run, engine="eager"), 1) == "all"  # the eager engine makes no copies
