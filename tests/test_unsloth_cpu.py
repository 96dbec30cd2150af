"""Unsloth's own Python code on the CPU, in a process of its own, against transformers in another.

``tests/workers/unsloth_cpu.py`` stands in for the GPU-only pieces (device queries, two Triton kernels);
the rest is the pinned Unsloth 2026.10.7 (installed by scripts/setup_env.sh into
``.venv/unsloth-cpu``, never into the project's environment): its class forwards, the fast
single-token decode with paged K/V buffers behind tarpo.patches' decode wrapper, the embedding
override for soft rows, for_inference/for_training, and the training forward with
tarpo.patches' flags. A tiny Qwen2 with a LoRA adapter and a router that sends about half the
steps soft; the transformers process scores the Unsloth rollout teacher-forced.
"""

import os
import subprocess
import sys

import pytest
import torch

from workers.backend_worker import compare, prepare
from helpers import TINY

HERE = os.path.dirname(os.path.abspath(__file__))
SITE = os.environ.get("TARPO_UNSLOTH_CPU_SITE", os.path.join(os.path.dirname(HERE), ".venv", "unsloth-cpu"))

pytestmark = pytest.mark.skipif(not os.path.isdir(os.path.join(SITE, "unsloth")),
                                reason=f"Unsloth for CPU tests is not installed in {SITE} (scripts/setup_env.sh)")


def run(tmp_path, *args, unsloth=False):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TARPO_COMPILE_BACKEND="aot_eager")  # tests/conftest.py says why
    if unsloth:
        env.update(UNSLOTH_ALLOW_CPU="1", UNSLOTH_COMPILE_LOCATION=str(tmp_path / "unsloth_cache"),
                   PYTHONPATH=os.pathsep.join([SITE, HERE]))
    res = subprocess.run([sys.executable, os.path.join(HERE, "workers", "backend_worker.py"), "--steps", "24",
                          "--completion", "32", "--keyed", *args], capture_output=True, text=True, timeout=600,
                         env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-5000:]


def test_unsloth_decode_and_training_forward_equal_transformers(tmp_path):
    base, adapter = prepare(str(tmp_path), TINY, torch.float32)
    un, hf = str(tmp_path / "unsloth.pt"), str(tmp_path / "hf.pt")
    run(tmp_path, "--backend", "unsloth", "--unsloth-on-cpu", "--model", base, "--adapter", adapter, "--out", un,
        unsloth=True)
    run(tmp_path, "--backend", "hf", "--model", base, "--adapter", adapter, "--out", hf, "--score", un)
    cand, ref = torch.load(un), torch.load(hf)
    assert cand["backbone"] == "UnslothBackbone" and ref["backbone"] == "Backbone"
    got = compare(cand, ref)
    assert got["hidden_rel_err"] < 1e-5 and got["logits_rel_err"] < 1e-5      # Unsloth's training forward
    assert got["rollout_soft_steps"] > 10 and got["rollout_hard_steps"] > 10
    assert got["rollout_logp_mean_abs_diff"] < 1e-4                            # its fast decode, teacher-forced
    assert got["rollout_p_soft_max_abs_diff"] < 1e-4
    assert got["free_running_token_agreement"] == 1.0                          # same draws, step for step
    assert got["loss_rel_diff"] < 1e-5 and got["grads_rel_err"] < 1e-4        # LoRA gradients through it
    assert not os.path.exists(os.path.join(HERE, "unsloth_compiled_cache"))
    # The compiled engine over a model Unsloth loaded (tarpo.engine.functional_decoder) draws what Unsloth's own
    # decode draws, and what transformers draws (eager and compiled), for the same keyed noise.
    for routing in ("learned", "hrpo"):
        base = cand["keyed"][routing, "eager"]  # Unsloth's decode path
        assert base["is_soft"].any() and (base["completion_mask"] & ~base["is_soft"]).any()
        for other in (cand["keyed"][routing, "compiled"], ref["keyed"][routing, "eager"],
                      ref["keyed"][routing, "compiled"]):
            for name in ("token_ids", "completion_mask", "is_soft", "decided"):
                assert torch.equal(other[name], base[name]), (routing, name)  # exact: integer ids and boolean masks
            for name in ("logp", "p_soft", "entropy"):
                torch.testing.assert_close(other[name], base[name], atol=1e-5, rtol=0, msg=f"{routing} {name}")


def test_unsloth_grouped_decode_attention_equals_its_own_and_copies_no_kv_per_head(tmp_path):
    """tarpo.patches.grouped_decode on Unsloth's decode path, left-padded rows: the same rollout as
    Unsloth's own attention (SDPA with ``enable_gqa`` and the padding mask, whose math kernel copies K/V
    per query head) and no such call; after the rollout none of its K/V (``UnslothBackbone._past``,
    Unsloth's paged buffers) is alive (tests/workers/unsloth_decode_worker.py)."""
    base, adapter = prepare(str(tmp_path), TINY, torch.float32)
    env = dict(os.environ, HF_HUB_OFFLINE="1", UNSLOTH_ALLOW_CPU="1",
               UNSLOTH_COMPILE_LOCATION=str(tmp_path / "unsloth_cache"), PYTHONPATH=os.pathsep.join([SITE, HERE]))
    runs = {}
    for name in ("grouped", "repeated"):
        out = str(tmp_path / f"{name}.pt")
        res = subprocess.run([sys.executable, os.path.join(HERE, "workers", "unsloth_decode_worker.py"), base,
                              adapter, out, *(["--repeated"] if name == "repeated" else [])],
                             capture_output=True, text=True,
                             timeout=600, env=env, cwd=str(tmp_path))
        assert res.returncode == 0, res.stderr[-5000:]
        runs[name] = torch.load(out)
    grouped, repeated = runs["grouped"], runs["repeated"]
    a, b = grouped["rollout"], repeated["rollout"]
    assert (a["prompt_mask"] == 0).any() and a["is_soft"].any()  # exact: an integer mask
    # exact: integer ids and boolean masks
    assert torch.equal(a["token_ids"], b["token_ids"]) and torch.equal(a["is_soft"], b["is_soft"])
    torch.testing.assert_close(a["logp"], b["logp"], atol=1e-5, rtol=0)
    torch.testing.assert_close(a["p_soft"], b["p_soft"], atol=1e-5, rtol=0)
    groups = grouped["groups"]
    assert groups > 1
    decode_steps = [c for c in repeated["calls"] if c["query"][2] == 1]
    assert decode_steps and all(c["gqa"] and c["mask"] for c in decode_steps)  # the reference expands K/V
    assert not any(c["gqa"] and c["mask"] for c in grouped["calls"])
    in_groups = [c for c in grouped["calls"] if c["query"][1] == c["key"][1] and c["query"][2] == groups]
    assert len(in_groups) == len(decode_steps)  # the same steps, each group's query heads along the query axis
    for run in (grouped, repeated):
        # exact: integer counts
        assert run["refs"] > 0 and run["alive"] == 0 and not run["modules_with_buffers"] and not run["past"]
    # host syncs of a decode step: Unsloth's own rotary length, int(position_ids.max().item()) (unsloth/models/
    # llama.py, LlamaModel_fast_forward_inference_custom), and every DONE_CHECK_EVERY steps the loop's end check.
    # Its check whether the padding mask is all ones is avoided (UnslothBackbone passes the 4-D mask).
    from tarpo.engine.records import DONE_CHECK_EVERY
    per_step = grouped["syncs_per_step"]
    assert per_step == [1 + ((t + 1) % DONE_CHECK_EVERY == 0) for t in range(len(per_step))], grouped["sync_sites"]
    rotary = [n for where, n in grouped["sync_sites"].items() if "models/llama.py" in where]
    assert rotary == [len(per_step)], grouped["sync_sites"]  # one per decoder call: after every step but the last


def test_after_unsloth_the_decode_step_compiles_under_its_own_settings_and_left_padding_is_kept(tmp_path):
    """Importing Unsloth sets dynamo's ``suppress_errors`` and inductor's ``memory_planning`` for the whole process;
    under them a decode step whose compile failed ran eagerly, and on CUDA that eager run was captured as the
    graph. The step compiles with both off (tarpo.engine.static_decode.STEP_SETTINGS) and only while it compiles
    (the process keeps Unsloth's); a backend that raises fails the rollout naming the step; inductor's code for
    the step of an Unsloth-loaded model draws the rollout the traced graph draws. And left padding, by
    behaviour: the training forward of a left-padded batch gives each row's log-probs at its real positions as
    the row alone unpadded does, and would not if Unsloth dropped the mask (tarpo.patches.training_forward's
    flag cleared). tests/workers/unsloth_rules_worker.py runs both in one process."""
    base, adapter = prepare(str(tmp_path), TINY, torch.float32)
    env = dict(os.environ, HF_HUB_OFFLINE="1", UNSLOTH_ALLOW_CPU="1",
               UNSLOTH_COMPILE_LOCATION=str(tmp_path / "unsloth_cache"), PYTHONPATH=os.pathsep.join([SITE, HERE]))
    out = str(tmp_path / "settings.pt")
    res = subprocess.run([sys.executable, os.path.join(HERE, "workers", "unsloth_rules_worker.py"), base, adapter,
                          out], capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-5000:]
    got = torch.load(out, weights_only=False)
    unsloths = {"suppress_errors": True, "memory_planning": True}
    assert got["process"] == unsloths == got["after"], got["process"]  # else this test proves nothing
    assert got["seen"] == [{"suppress_errors": False, "memory_planning": False}], got["seen"]
    assert got["failure"] is not None and "decode step" in got["failure"], got["failure"]
    assert "forced failure of the compile backend" in got["failure"], got["failure"]
    a, b = got["recorded"], got["inductor"]
    # exact: integer ids and boolean masks, the same seeded draws over logits within fp32 rounding
    assert torch.equal(a["token_ids"], b["token_ids"]) and torch.equal(a["is_soft"], b["is_soft"])
    assert a["is_soft"].any() and (~a["is_soft"] & a["completion_mask"]).any()
    torch.testing.assert_close(a["logp"], b["logp"], atol=1e-5, rtol=0)
    padding = got["padding"]
    assert got["padded"] and padding["kept"] <= 1e-5, padding  # tolerance: another batch shape, fp32 rounding
    assert padding["dropped"] > 1e-2, padding  # the comparison sees a dropped mask

