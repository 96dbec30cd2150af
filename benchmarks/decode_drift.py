"""The rollout/training mismatch of each decode-weight setting (docs/rollout-engines.md, the measurements of
decode weights made for decoding): how far the training forward's log-probabilities of a rollout's tokens are
from the rollout's own.

One model (a random one of ``--shape``, LoRA r 32 on ``--lora-targets`` with a random ``B``, as a trained
adapter's), one router (b0 = [2.2, 0]), ``--batch`` left-padded prompts; for each engine setting of ``--settings``
(``eager``: the eager engine; ``compiled:<merge>``: the compiled engine at that ``decode_merge``; ``+fp32head``: the
head's logits in fp32 on both sides, :class:`Fp32Head`) one rollout with
the same keyed noise, scored by the trainer's training forward (:func:`tarpo.training.scoring.score_rollout`, the
policy alone) under the trainer's autocast, and the drift of the two (:func:`tarpo.training.metrics.logp_drift`:
mean |delta log p| over the completion steps, its 99th percentile, its maximum, the share over 0.1), for every
dtype of ``--dtypes``. The same tokens are not drawn by every setting (a different rounding flips a draw now and
then), so each row's drift is of its own rollout.

    python benchmarks/decode_drift.py --shape smollm2-135m --layers 4 --dtypes fp32,bf16 [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_write_positions import SHAPES, load_lora_model  # noqa: E402
from tarpo.engine.backbone import Backbone, unwrap  # noqa: E402
from tarpo.engine.precision import mixed_precision  # noqa: E402
from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate  # noqa: E402
from tarpo.engine.soft_input import TOP_K_MIXTURE  # noqa: E402
from tarpo.engine.router import Router  # noqa: E402
from tarpo.engine.tagging import token_text_fn  # noqa: E402
from tarpo.models.backends import make_backbone  # noqa: E402
from tarpo.models.loading import load_tokenizer  # noqa: E402
from tarpo.models.tiny import left_padded_prompts, random_model_dir  # noqa: E402
from tarpo.training.metrics import logp_drift  # noqa: E402
from tarpo.training.scoring import ScoreSettings, score_rollout  # noqa: E402


class Fp32Head:
    """While active, every backbone's head computes its logits in fp32 (the bf16 hidden state and head weight cast
    up, autocast off) in the rollout and in the training forward alike: a variant measured beside the decode-weight
    settings."""

    def __enter__(self):
        self.logits = Backbone.logits

        def logits(backbone, hidden):
            with torch.autocast(hidden.device.type, enabled=False):
                return torch.nn.functional.linear(hidden.float(), backbone.lm_head.weight.float())
        Backbone.logits = logits
        torch._dynamo.reset()  # the compiled step traces the head it is given
        return self

    def __exit__(self, *exc):
        Backbone.logits = self.logits
        torch._dynamo.reset()


def drift_of(model, tok, router, prompts, spec) -> dict:
    """One rollout with ``spec`` and its training forward's drift."""
    backbone = make_backbone(model)
    with mixed_precision(backbone):
        policy = Policy(backbone, token_text_fn(tok), [tok.eos_token_id], tok.pad_token_id, router, TOP_K_MIXTURE)
        rollout = hybrid_generate(policy, *prompts, spec, noise_seed=7)
        with torch.no_grad():
            scores = score_rollout(backbone, router, None, rollout, ScoreSettings(
                temperature=spec.temperature, chunk_size=1024, use_router=True, with_reference=False), TOP_K_MIXTURE)
    d = logp_drift(scores.logp_tok.float(), rollout.logp, rollout.completion_mask)
    return {**{k: v.item() for k, v in d.items()}, "steps": int(rollout.completion_mask.sum()),
            "soft_ratio": float(rollout.is_soft.sum() / rollout.units.sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--settings", default="eager,compiled:none,compiled:all")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--json")
    args = ap.parse_args()
    shape = {k: v for k, v in SHAPES[args.shape].items() if k != "model_type"}
    shape["num_hidden_layers"] = args.layers
    folder = random_model_dir(tempfile.mkdtemp(prefix="decode-drift-"), shape, torch.float32,
                              arch=SHAPES[args.shape]["model_type"])
    tok = load_tokenizer(folder)
    res = {"shape": args.shape, "layers": args.layers, "lora_targets": args.lora_targets, "batch": args.batch,
           "steps": args.steps, "torch": torch.__version__, "rows": {}}
    for dtype in args.dtypes.split(","):
        torch.manual_seed(0)
        model, _ = load_lora_model(folder, False, args.prompt + args.steps, args.steps, args.lora_targets,
                                   bf16=dtype == "bf16")
        router = Router(unwrap(model).config.hidden_size, bias=[2.2, 0.0], init_std=0.02)
        prompts = left_padded_prompts(args.batch, args.prompt, len(tok), tok.pad_token_id)
        spec = RolloutSpec(max_new_tokens=args.steps, temperature=0.5, routing="learned",
                           max_prompt_length=args.prompt, batch_size=args.batch)
        for setting in args.settings.split(","):
            engine, _, merge = setting.removesuffix("+fp32head").partition(":")
            run = replace(spec, engine=engine, **({"decode_merge": merge} if merge else {}))
            with Fp32Head() if setting.endswith("+fp32head") else contextlib.nullcontext():
                res["rows"][f"{dtype} {setting}"] = row = drift_of(model, tok, router, prompts, run)
            print(f"{dtype} {setting}: {json.dumps(row)}", flush=True)
    if args.json:
        from results_file import record
        record(args.json, "decode_drift", res)


if __name__ == "__main__":
    main()
