"""tarpo.patches without a GPU: target checks against the pinned Unsloth source, loud failures,
the TRL guard, and the installed package layout (the patches install as tarpo.patches)."""

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import trl.trainer.grpo_trainer as grpo

from tarpo.patches import EXPECTED_VERSIONS, PatchError, check_source, check_versions
from tarpo.patches.targets import TARGETS
from tarpo.patches.trl_guard import check_overrides, pristine_grpo_trainer
from tarpo.training.trainer import TarpoTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
unsloth_installed = importlib.util.find_spec("unsloth") is not None


@pytest.mark.skipif(not unsloth_installed, reason="unsloth is not installed (scripts/install_gpu.sh)")
def test_patch_targets_exist_with_the_expected_signatures_in_the_installed_unsloth():
    check_versions()
    check_source()


CPU_SITE_UNSLOTH = os.path.join(ROOT, ".venv", "unsloth-cpu", "unsloth")


@pytest.mark.skipif(not os.path.isdir(CPU_SITE_UNSLOTH), reason="no Unsloth in .venv/unsloth-cpu (setup_env.sh)")
def test_patch_targets_exist_in_the_pinned_unsloth_kept_for_cpu_tests():
    from importlib.metadata import PathDistribution
    from pathlib import Path
    dist = Path(CPU_SITE_UNSLOTH).parent / f"unsloth-{EXPECTED_VERSIONS['unsloth']}.dist-info"
    assert PathDistribution(dist).version == EXPECTED_VERSIONS["unsloth"]
    check_source(CPU_SITE_UNSLOTH)


def _fake_unsloth(tmp_path, llama_source):
    (tmp_path / "models").mkdir(parents=True)
    (tmp_path / "models" / "llama.py").write_text(llama_source)
    (tmp_path / "models" / "qwen2.py").write_text("class FastQwen2Model:\n    def pre_patch():\n        pass\n")
    return str(tmp_path)


def _source_with(params_of):
    """A synthetic llama.py with every target of TARGETS at the given parameters (not Unsloth's code)."""
    tree = {}
    for rel, dotted, params in TARGETS:
        if rel == "models/llama.py":
            node = tree
            for name in dotted.split("."):
                node = node.setdefault(name, {})
            node["()"] = params_of.get(dotted, params)

    def emit(node, indent):
        out = []
        for name, child in node.items():
            if name == "()":
                continue
            if "()" in child:
                out.append(f"{indent}def {name}({', '.join(child['()'])}):")
                if name == "LlamaAttention_fast_forward_inference":  # the call tarpo.patches.grouped_decode swaps
                    out.append(f"{indent}    scaled_dot_product_attention(Qn, Knn, Vnn, attn_mask = attention_mask, "
                               "is_causal = is_causal, enable_gqa = True)")
                if name == "LlamaModel_fast_forward":  # the flag tarpo.patches.training_forward sets
                    out.append(f"{indent}    keep = getattr(self, '_unsloth_keep_padding_mask', False)")
            else:
                out.append(f"{indent}class {name}:")
            out += emit(child, indent + "    ") or [f"{indent}    pass"]
        return out

    return "\n".join(emit(tree, "")) + "\n"


def test_source_check_passes_on_matching_targets_and_names_the_function_otherwise(tmp_path):
    check_source(_fake_unsloth(tmp_path / "ok", _source_with({})))
    changed = "_LlamaModel_fast_forward_inference.LlamaModel_fast_forward_inference_custom"
    root = _fake_unsloth(tmp_path / "bad", _source_with({changed: ["self", "input_ids", "cache"]}))
    with pytest.raises(PatchError, match=r"LlamaModel_fast_forward_inference_custom.*unsloth==2026\.10\.7"):
        check_source(root)
    source = _source_with({}).replace("def LlamaModel_fast_forward(", "def LlamaModel_forward_renamed(")
    with pytest.raises(PatchError, match=r"function LlamaModel_fast_forward not found .*unsloth==2026\.10\.7"):
        check_source(_fake_unsloth(tmp_path / "gone", source))
    source = _source_with({}).replace("enable_gqa = True", "enable_gqa = False")
    with pytest.raises(PatchError, match=r"LlamaAttention_fast_forward_inference no longer calls "
                                         r"scaled_dot_product_attention.*unsloth==2026\.10\.7"):
        check_source(_fake_unsloth(tmp_path / "nogqa", source))
    source = _source_with({}).replace("'_unsloth_keep_padding_mask'", "'_some_other_flag'")
    with pytest.raises(PatchError, match=r"LlamaModel_fast_forward does not read _unsloth_keep_padding_mask: its "
                                         r"training forward would drop the padding mask.*unsloth==2026\.10\.7"):
        check_source(_fake_unsloth(tmp_path / "dropsmask", source))


@pytest.mark.skipif(unsloth_installed, reason="unsloth is installed here")
def test_version_check_names_the_expected_version():
    with pytest.raises(PatchError, match=f"unsloth=={EXPECTED_VERSIONS['unsloth']}; found none installed"):
        check_versions()


def test_tarpo_subclasses_trls_own_grpo_trainer_and_refuses_a_swapped_one(monkeypatch):
    # TRL's own class, right after TARPO's (the trainer and its mixins: tarpo.training.trainer_checkpoints, ...)
    mro = TarpoTrainer.__mro__
    trl_at = mro.index(pristine_grpo_trainer())
    assert trl_at > 1 and all(c.__module__.startswith("tarpo.training.") for c in mro[:trl_at])
    assert "compute_loss" in TarpoTrainer.__dict__  # Unsloth's compute_loss would skip _compute_loss

    class UnslothGRPOTrainer:  # what `import unsloth` binds to trl.GRPOTrainer
        pass

    monkeypatch.setattr(grpo, "GRPOTrainer", UnslothGRPOTrainer)
    with pytest.raises(PatchError, match="Import tarpo .*before unsloth"):
        pristine_grpo_trainer()


def test_override_check_catches_replaced_methods(model, tokenizer, tmp_path):
    from test_trainer import letter_reward, make_args, make_dataset
    trainer = TarpoTrainer(model=model, reward_funcs=letter_reward, args=make_args(tmp_path),
                           train_dataset=make_dataset(), processing_class=tokenizer)
    check_overrides(trainer, TarpoTrainer)
    trainer.compute_loss = lambda *a, **k: 0.0  # an instance-level injection
    with pytest.raises(PatchError, match="compute_loss of TarpoTrainer was replaced on the instance"):
        trainer.train()
    del trainer.compute_loss
    # the checkpoint methods live in TarpoTrainer's mixin (tarpo.training.trainer_checkpoints): guarded all the same
    assert "_save_checkpoint" not in TarpoTrainer.__dict__
    trainer._save_checkpoint = lambda *a, **k: None
    with pytest.raises(PatchError, match="_save_checkpoint of TarpoTrainer was replaced on the instance"):
        check_overrides(trainer, TarpoTrainer)
    del trainer._save_checkpoint

    class Wrapped(TarpoTrainer):
        pass

    def wrapped(self, *a, **k):
        return TarpoTrainer._compute_loss(self, *a, **k)
    wrapped._unsloth_restore_training_wrapped = True
    Wrapped._compute_loss = wrapped
    trainer.__class__ = Wrapped
    with pytest.raises(PatchError, match="_compute_loss of Wrapped carries Unsloth's wrapper markers"):
        check_overrides(trainer, TarpoTrainer)


def test_the_patches_install_as_tarpo_patches_only(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "README.md", "requirements.txt"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    for name in ("tarpo", "patches"):
        shutil.copytree(os.path.join(ROOT, name), src / name, ignore=shutil.ignore_patterns("__pycache__"))
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                          str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (wheel,) = (tmp_path / "dist").iterdir()
    names = zipfile.ZipFile(wheel).namelist()
    assert "tarpo/patches/decode_hidden.py" in names and "tarpo/patches/trl_guard.py" in names
    assert all(n.startswith(("tarpo/", "tarpo-")) for n in names), [n for n in names if not n.startswith("tarpo")]


def test_unsloth_patch_grouped_sdpa_equals_sdpa_with_enable_gqa_and_a_padding_mask():
    """tarpo.patches.grouped_decode's stand-in for Unsloth's decode SDPA call (Unsloth itself:
    tests/test_unsloth_cpu.py)."""
    import torch

    from tarpo.patches.grouped_decode import grouped_sdpa

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, h, length, 16, generator=g) for h, length in ((8, 1), (2, 11), (2, 11)))
    mask = torch.ones(3, 1, 1, 11, dtype=torch.bool)
    mask[1, ..., :4] = False  # left padding
    mask[2, ..., :7] = False
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    ours = grouped_sdpa(q, k, v, attn_mask=mask, is_causal=False, enable_gqa=True)
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=0)
    full = torch.randn(3, 8, 5, 16, generator=g)  # not a decode step: torch's function as called
    torch.testing.assert_close(grouped_sdpa(full, k, v, attn_mask=None, enable_gqa=True),
                               torch.nn.functional.scaled_dot_product_attention(full, k, v, enable_gqa=True))
