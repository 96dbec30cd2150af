"""Completions of a trained system for prompts of one's own (``tarpo generate``, or :func:`generate` from Python).

A TARPO (or HRPO, Soft Tokens, ...) model decodes through the hybrid loop it was trained with: at a soft step the
next input is a mixture of token embeddings, not a token, which transformers' ``generate`` and vLLM cannot feed
(docs/algorithm.md §1). So sampling goes through :func:`tarpo.evaluation.sample.sample`, the engine of training and
``tarpo eval``; each completion comes back as its text, the text with its soft steps wrapped in ``⟦ ⟧``
(``marked``), and per unit the routing action and the router's p(soft). From Python::

    from tarpo.evaluation.generate import generate
    outs = generate("Qwen/Qwen2.5-3B-Instruct", ["What is 7 * 8?"], adapter="runs/<run>/adapter", kind="math")
    print(outs[0]["completion"], outs[0]["marked"], outs[0]["soft_steps"])
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..tasks.chat_messages import messages, system_prompts
from .sample import sample
from .system import RUN_FLAGS, check_system, fill_run_settings, load_system, rollout_spec


def check_kind(kind: str) -> None:
    """``kind`` is a task kind with a chat prompt (``resources/prompts.json``), else a ValueError naming them."""
    kinds = sorted(k for k in system_prompts() if not k.startswith("_"))
    if kind not in kinds:
        raise ValueError(f"kind {kind!r}: not a prompt kind ({', '.join(kinds)})")


def prompt_of(text: str, kind: str | None, chat: bool):
    """The prompt a question is decoded from: ``kind``'s chat prompt (its system prompt and worked examples,
    :mod:`tarpo.tasks.chat_messages`: what a run on that kind of task trained on), else a single user turn where the
    tokenizer has a chat template (``chat``), else the text as it is.

    >>> prompt_of("2 + 2?", None, True), prompt_of("2 + 2?", None, False)
    ([{'role': 'user', 'content': '2 + 2?'}], '2 + 2?')
    >>> [m["role"] for m in prompt_of("2 + 2?", "math", True)]
    ['system', 'user']
    """
    if kind is not None:  # checked by generate() before anything loads (check_kind)
        return messages(kind, text)
    return [{"role": "user", "content": text}] if chat else text


def generate(model: str, prompts: list[str], *, adapter: str | None = None, mode: str = "tarpo", n: int = 1,
             kind: str | None = None, max_new_tokens: int = 512, max_prompt_length: int = 1024,
             temperature: float | None = None, soft_top_k: int | None = None, seed: int = 0, soft_detail: int = 0,
             **settings) -> list[dict]:
    """``n`` completions of each of ``prompts`` from ``model`` (hub id or folder) with ``adapter`` (a trained run's
    ``adapter/``: LoRA, router, soft input) in the inference ``mode`` (:data:`tarpo.algorithms.MODES`; ``cot`` or
    ``hard`` without a router). ``kind``: wrap each prompt in that task kind's chat prompt (``math``, ``arith``, ...).
    ``temperature`` and ``soft_top_k`` default to TarpoConfig's (T_s, k), the routing settings (``settings``:
    :data:`tarpo.evaluation.system.RUN_FLAGS`) to the run's, read beside the adapter, else TarpoConfig's.
    Returns one dict a completion, prompts in order, each one's samples together: ``prompt`` (its index),
    ``sample``, ``completion``, ``marked`` (soft steps in ``⟦ ⟧``), ``actions``, ``p_soft``, ``units``,
    ``hard_tokens``, ``soft_steps`` (and ``soft_top`` with ``soft_detail`` > 0)."""
    unknown = set(settings) - set(RUN_FLAGS)
    if unknown:
        raise ValueError(f"generate(): no setting {', '.join(sorted(unknown))} (settings: {', '.join(RUN_FLAGS)})")
    if not prompts or n < 1:
        raise ValueError("generate(): give at least one prompt and n >= 1")
    check_system(adapter, mode)  # before the model loads, as the kind
    if kind is not None:
        check_kind(kind)
    given = SimpleNamespace(adapter=adapter, **{name: settings.get(name) for name in RUN_FLAGS})
    fill_run_settings(given)  # the run's value, else TarpoConfig's, where not given (as tarpo eval and tarpo case)
    spec = rollout_spec({"max_new_tokens": max_new_tokens, "soft_top_k": soft_top_k, "temperature": temperature,
                         **{name: getattr(given, name) for name in RUN_FLAGS}})  # None: the field's default
    system = load_system(model, adapter, mode)
    chat = getattr(system.tokenizer, "chat_template", None) is not None
    examples = [{"id": i, "prompt": prompt_of(text, kind, chat)} for i, text in enumerate(prompts)]
    generator = torch.Generator(system.device).manual_seed(seed)
    records = sample(system, examples, n, spec, max_prompt_length=max_prompt_length, generator=generator,
                     soft_detail=soft_detail)
    return [{"prompt": r.pop("id"), **r} for r in records]
