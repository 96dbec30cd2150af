"""One backend's side of the Unsloth-vs-transformers equivalence check, in a process of its own.

Importing Unsloth changes transformers for the whole process (its ``pre_patch`` rebinds the
Qwen2/Llama class forwards; its gradient checkpointing replaces transformers' checkpoint
function), so the two backends never share one: ``tests/test_gpu.py`` runs this script once
per backend and compares what they wrote with :func:`compare`. On CPU,
``tests/test_backend_worker.py`` runs it twice on the transformers backend, which checks
everything here except Unsloth itself.

    python tests/workers/backend_worker.py --backend unsloth --model M --adapter A --out un.pt
    python tests/workers/backend_worker.py --backend hf --model M --adapter A --out hf.pt --score un.pt

The file (``torch.save``) holds:

- ``hidden``, ``logits``: normed final hidden states and logits at the real positions of a
  fixed left-padded batch (fp32 copies); the transformers backend also writes ``hidden_fp32`` and
  ``logits_fp32``, the same forward with the model in fp32: the yardstick of both backends' 16-bit error;
- ``rollout``: a seeded hybrid rollout of that batch (learned routing, the adapter's router);
- ``keyed`` (with ``--keyed``): rollouts of that batch with keyed noise, learned and HRPO routing, on the eager and the
  compiled engine (:func:`keyed_rollouts`);
- ``scores``: with ``--score FILE``, this backend's teacher-forced ``logp`` and ``p_soft`` of
  the rollout in FILE;
- ``loss``, ``grads``: the TARPO loss of a synthetic recorded batch and the gradients of every
  LoRA B matrix (the adapter's A and B both trained, as the trainer does);
- ``changed``: for one real ``TarpoTrainer`` step on the launchers' model path
  (:func:`tarpo.models.loading.training_policy`), whether each trainable tensor changed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(TESTS), TESTS]  # this checkout's tarpo; tests/ (checkout, helpers)
from checkout import use_checkout_patches  # noqa: E402  (and its tarpo.patches)

ROWS, PROMPT_LEN = 4, 48


def prepare(root: str, config: dict, dtype) -> tuple[str, str]:
    """A random-init Qwen2 of ``config`` (:func:`tarpo.models.tiny.random_model_dir`) and a saved adapter
    for it: LoRA r 32 on q/k/v/o with nonzero B (so the adapter matters) and a router with
    b0 = [0, 0] (about half the steps soft). Returns ``(model_dir, adapter_dir)``."""
    from peft import LoraConfig, get_peft_model

    from tarpo.engine.router import Router
    from tarpo.models.tiny import random_model_dir
    base = random_model_dir(os.path.join(root, "base"), config, dtype)
    model = load_base(base, dtype)
    torch.manual_seed(0)
    peft = get_peft_model(model, LoraConfig(r=32, lora_alpha=64,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                            init_lora_weights=False))
    adapter = os.path.join(root, "adapter")
    peft.save_pretrained(adapter)
    Router(model.config.hidden_size, bias=(0.0, 0.0)).save(adapter)
    return base, adapter


def load_base(path, dtype):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def fixed_batch(vocab: int, device):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab, (ROWS, PROMPT_LEN), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0  # left padding
    mask[3, :20] = 0
    return ids.to(device), mask.to(device)


def hidden_and_logits(backbone, ids, mask):
    from tarpo.engine.backbone import positions_from_mask
    with torch.no_grad():
        hidden = backbone.hidden(backbone.embed_weight[ids], mask, positions_from_mask(mask))[mask.bool()]
        return hidden.float().cpu(), backbone.logits(hidden).float().cpu()


def rollout(backbone, router, tok, ids, mask, steps):
    from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate
    from tarpo.engine.soft_input import TOP_K_MIXTURE
    from tarpo.engine.tagging import token_text_fn
    spec = RolloutSpec(max_new_tokens=steps, temperature=0.5, routing="learned")
    gen = torch.Generator(ids.device).manual_seed(0)
    policy = Policy(backbone, token_text_fn(tok), [tok.eos_token_id], tok.pad_token_id, router, TOP_K_MIXTURE)
    r = hybrid_generate(policy, ids, mask, spec, generator=gen)
    return {k: v.cpu() for k, v in vars(r).items()}


def keyed_rollouts(backbone, router, tok, ids, mask, steps, hidden_size, device):
    """Rollouts of the fixed batch with keyed noise (seed 3) on both engines, learned and HRPO routing:
    ``{(routing, engine): record}``; any backend, so each can be compared with the others."""
    from tarpo.engine.soft_input import TOP_K_MIXTURE, HrpoGate
    from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate
    from tarpo.engine.tagging import token_text_fn
    out = {}
    for routing in ("learned", "hrpo"):
        soft_input = HrpoGate(hidden_size, seed=0).to(device) if routing == "hrpo" else TOP_K_MIXTURE
        for engine in ("eager", "compiled"):
            spec = RolloutSpec(max_new_tokens=steps, temperature=0.5, routing=routing, engine=engine)
            policy = Policy(backbone, token_text_fn(tok), [tok.eos_token_id], tok.pad_token_id, router, soft_input)
            r = hybrid_generate(policy, ids, mask, spec, noise_seed=3)
            out[routing, engine] = {k: v.cpu() for k, v in vars(r).items()}
    return out


def teacher_forced(backbone, router, record, device):
    from tarpo.engine.rollout import Rollout
    from tarpo.engine.soft_input import TOP_K_MIXTURE
    from tarpo.training.scoring import ScoreSettings, score_rollout
    r = Rollout(**{k: v.to(device) for k, v in record.items()})
    with torch.no_grad():
        s = score_rollout(backbone, router, None, r,
                          ScoreSettings(temperature=0.5, chunk_size=256, use_router=True, with_reference=False),
                          TOP_K_MIXTURE)
    return {"logp": s.logp_tok.cpu(), "p_soft": (1 - s.p_hard).cpu()}


def loss_and_grads(model, backbone, router, device, completion: int):
    from tarpo.training.loss_inputs import rollout_loss
    from tarpo.training.objective import LossSettings
    from tarpo.training.scoring import ScoreSettings, score_rollout
    from tarpo.engine.soft_input import TOP_K_MIXTURE
    from tarpo.models.tiny import synthetic_rollout
    r = synthetic_rollout(model.config.vocab_size, 8, PROMPT_LEN, completion, 30, device)
    adv = torch.randn(8, generator=torch.Generator().manual_seed(1)).to(device)
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)  # a saved adapter loads frozen; train it as the trainer does
    model.train()
    scores = score_rollout(backbone, router, router.frozen_copy(), r,
                           ScoreSettings(temperature=0.5, chunk_size=512, use_router=True, with_reference=True),
                           TOP_K_MIXTURE)
    loss, _ = rollout_loss(LossSettings(lambda_act=0.1, beta=0.005, alpha=1.0), scores, r, adv)
    loss.backward()
    grads = torch.cat([p.grad.float().flatten().cpu() for n, p in sorted(model.named_parameters())
                       if "lora_B" in n])
    model.zero_grad(set_to_none=True)
    model.eval()
    return loss.item(), grads


def train_step(model_dir: str, backend: str, bf16: bool, completion: int) -> dict:
    """One TarpoTrainer step as the launchers build it; name -> did it change."""
    import datasets

    from tarpo.config import TarpoConfig
    from tarpo.models.loading import load_tokenizer, training_policy
    from tarpo.training.trainer import TarpoTrainer

    def reward(prompts, completions, completion_ids, **kw):  # spread inside every group: nonzero advantages
        # of the token ids, not the text: a random model of a real vocabulary beside a 400-token tokenizer
        # samples ids that decode to nothing, and a reward of the text was then the same in every row
        return [float(sum(ids) % 7) for ids in completion_ids]

    data = datasets.Dataset.from_list([{"prompt": f"question {i}: what is {i} plus {i + 1}?"} for i in range(8)])
    with tempfile.TemporaryDirectory() as out:
        args = TarpoConfig(output_dir=out, bf16=bf16, per_device_train_batch_size=8, num_generations=4,
                           max_completion_length=completion, max_steps=1, warmup_steps=0,
                           lr_scheduler_type="constant", learning_rate=1e-3, router_lr=1e-2,
                           action_bias=[0.0, 0.0], save_strategy="no", report_to="none", seed=0,
                           gradient_checkpointing=True)
        model = training_policy(model_dir, args, backend, "bfloat16" if bf16 else "float32")
        trainer = TarpoTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                               processing_class=load_tokenizer(model_dir))
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        trainer.train()
        # exact: any change at all counts as trained
        return {n: not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters()
                if n in before}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["hf", "unsloth"], required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--score", help="a file this script wrote for the other backend: score its rollout")
    ap.add_argument("--steps", type=int, default=64, help="rollout steps")
    ap.add_argument("--keyed", action="store_true",
                    help="also the keyed-noise rollouts of both engines (keyed_rollouts)")
    ap.add_argument("--completion", type=int, default=256, help="completion length of the scored synthetic batch")
    ap.add_argument("--unsloth-on-cpu", action="store_true",
                    help="Unsloth's Python code on the CPU, its Triton kernels stood in for "
                         "(tests/workers/unsloth_cpu.py); no trainer step")
    args = ap.parse_args(argv)

    use_checkout_patches()
    import tarpo.training.trainer  # noqa: F401  (TRL's own GRPOTrainer before Unsloth can replace it)
    from tarpo.models.backends import make_backbone
    from tarpo.models.loading import load_trained

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    if args.unsloth_on_cpu:
        import unsloth_cpu
        model, router, tok = unsloth_cpu.load_trained(args.model, args.adapter)
    else:
        model, router, tok = load_trained(args.model, args.adapter, dtype, device if args.backend == "hf" else None,
                                          backend=args.backend, max_seq_length=1024)
    model.eval()
    backbone = make_backbone(model)
    ids, mask = fixed_batch(model.config.vocab_size, device)
    out = {"backend": args.backend, "backbone": type(backbone).__name__}
    out["hidden"], out["logits"] = hidden_and_logits(backbone, ids, mask)
    out["rollout"] = rollout(backbone, router, tok, ids, mask, args.steps)
    if args.keyed:
        out["keyed"] = keyed_rollouts(backbone, router, tok, ids, mask, args.steps, model.config.hidden_size, device)
    if args.score:
        out["scores"] = teacher_forced(backbone, router, torch.load(args.score)["rollout"], device)
    out["loss"], out["grads"] = loss_and_grads(model, backbone, router, device, args.completion)
    if args.backend == "hf":  # the yardstick of the 16-bit forwards: the same model and batch in fp32
        out["hidden_fp32"], out["logits_fp32"] = hidden_and_logits(make_backbone(model.float()), ids, mask)
    del model, backbone
    out["changed"] = None if args.unsloth_on_cpu else train_step(args.model, args.backend, cuda,
                                                                  max(8, args.steps // 4))
    tmp = args.out + ".tmp"
    torch.save(out, tmp)
    os.replace(tmp, args.out)
    return 0


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30)).item()


def compare(cand: dict, ref: dict) -> dict:
    """Agreement of ``cand`` (the backend under test) with ``ref``, which scored cand's rollout."""
    r, s = cand["rollout"], ref["scores"]
    m, d = r["completion_mask"], r["decided"]
    return {
        "hidden_rel_err": rel_err(cand["hidden"], ref["hidden"]),
        "logits_rel_err": rel_err(cand["logits"], ref["logits"]),
        # each backend's error against the transformers forward in fp32 (ref holds it: the hf side)
        **{f"{what}_rel_err_to_fp32{side}": rel_err(got[what], ref[f"{what}_fp32"])
           for what in ("hidden", "logits") for side, got in (("", cand), ("_ref", ref))},
        "rollout_soft_steps": int((r["is_soft"] & m).sum()), "rollout_hard_steps": int((~r["is_soft"] & m).sum()),
        "rollout_logp_mean_abs_diff": (s["logp"][m] - r["logp"][m]).abs().mean().item(),
        "rollout_p_soft_max_abs_diff": (s["p_soft"][d] - r["p_soft"][d]).abs().max().item() if d.any() else 0.0,
        "free_running_token_agreement": (cand["rollout"]["token_ids"] == ref["rollout"]["token_ids"]).float()
        .mean().item() if cand["rollout"]["token_ids"].shape == ref["rollout"]["token_ids"].shape else float("nan"),
        "loss": cand["loss"], "loss_ref": ref["loss"],
        "loss_rel_diff": abs(cand["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-3),
        "grads_rel_err": rel_err(cand["grads"], ref["grads"]),
        **({} if cand["changed"] is None else {
            "unchanged_after_step": sorted(n for n, c in cand["changed"].items() if not c),
            "unchanged_after_step_ref": sorted(n for n, c in ref["changed"].items() if not c),
            "trained_tensors": len(cand["changed"]), "trained_tensors_ref": len(ref["changed"])}),
    }


if __name__ == "__main__":
    from tarpo.process_exit import skip_the_final_collection
    skip_the_final_collection()  # as the project's commands: no last collection over the imports
    sys.exit(main())
