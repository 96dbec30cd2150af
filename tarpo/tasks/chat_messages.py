"""The chat prompt of a question: its kind's system prompt (the authors', docs/algorithm.md §6), the kind's worked
examples as earlier turns, then the question; and the kind's answer tag. The prompts are data in
``resources/prompts.json``.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources


@cache
def system_prompts() -> dict:
    return json.loads(resources.files("tarpo").joinpath("resources/prompts.json").read_text())


def messages(kind: str, user: str) -> list[dict]:
    """The chat prompt of a question: the kind's system prompt, its worked examples as earlier turns (a kind with
    ``examples``: [question, answer] pairs), then the question.

    >>> [m["role"] for m in messages("arith_shots", "Compute 1 + 2.")]
    ['system', 'user', 'assistant', 'user', 'assistant', 'user']
    """
    prompt = system_prompts()[kind]
    shots = [{"role": role, "content": text} for pair in prompt.get("examples", ())
             for role, text in zip(("user", "assistant"), pair)]
    return [{"role": "system", "content": prompt["system"]}, *shots, {"role": "user", "content": user}]


def answer_tag(kind: str) -> str:
    return system_prompts()[kind]["answer_tag"]
