"""``tarpo generate``: completions of a trained system for prompts of one's own, soft steps shown or hidden.

    tarpo generate --model Qwen/Qwen2.5-3B-Instruct --adapter runs/<run>/adapter --kind math \\
        --prompt "What is the sum of the first 10 odd numbers?" --n 2 --show-soft

Decodes through the hybrid loop the model was trained with (a soft step feeds a mixture of embeddings, which
transformers' ``generate`` and vLLM cannot; :mod:`tarpo.evaluation.generate`). Prints each completion under a line
naming its prompt and sample; ``--show-soft`` wraps the soft steps' text in ``⟦ ⟧`` and gives their count;
``--json`` prints one JSON object a completion instead (text, marked text, actions, p(soft) per unit).
"""

from __future__ import annotations

import argparse
import json

from ..algorithms import MODES
from ..config import add_flags
from ..evaluation.system import RUN_FLAGS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="base model: hub id or local folder")
    p.add_argument("--adapter", help="a trained run's adapter/ folder (LoRA, router, soft input); none: the base "
                                       "model (with --mode cot or hard)")
    p.add_argument("--mode", default="tarpo", choices=list(MODES), help="inference mode (cot without a router)")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeat the flag for more)")
    p.add_argument("--prompts-file", help="a text file, one prompt a line")
    p.add_argument("--kind", help="wrap each prompt in this task kind's chat prompt (math, arith, ...): the format "
                                  "a run on that task trained on; default: one user turn")
    p.add_argument("--n", type=int, default=1, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--max-prompt-length", type=int, default=1024)
    add_flags(p, ("temperature", "soft_top_k", *RUN_FLAGS), from_run=RUN_FLAGS)  # defaults and help: TarpoConfig's
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show-soft", action="store_true", help="mark soft steps with ⟦ ⟧")
    p.add_argument("--json", action="store_true", help="one JSON object a completion")


def read_prompts(args) -> list[str]:
    """The prompts of ``--prompt`` then ``--prompts-file`` (blank lines skipped), checked before any model loads."""
    prompts = list(args.prompt)
    if args.prompts_file:
        with open(args.prompts_file, encoding="utf-8") as f:
            prompts += [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        raise ValueError("no prompt: give --prompt TEXT or --prompts-file FILE")
    return prompts


def run(args) -> int:
    from ..evaluation.generate import generate
    prompts = read_prompts(args)
    outs = generate(args.model, prompts, adapter=args.adapter, mode=args.mode, n=args.n, kind=args.kind,
                    max_new_tokens=args.max_new_tokens, max_prompt_length=args.max_prompt_length,
                    temperature=args.temperature, soft_top_k=args.soft_top_k, seed=args.seed,
                    **{name: getattr(args, name) for name in RUN_FLAGS if getattr(args, name) is not None})
    for out in outs:
        if args.json:
            print(json.dumps(out, ensure_ascii=False))
            continue
        soft = f", {out['soft_steps']} soft of {out['units']} steps" if args.show_soft else ""
        print(f"--- prompt {out['prompt']}, sample {out['sample']}{soft}")
        print(out["marked"] if args.show_soft else out["completion"])
    return 0
