"""Prompts to token ids, within ``max_prompt_length``, for training and evaluation.

A chat prompt (a list of messages) gets the tokenizer's chat template and generation prompt.
When it is longer than ``max_length`` tokens, the **last user turn** is cut from the left (its
start is dropped) until the whole prompt fits: the system prompt, the other turns and the
template are kept, so the model still sees its instructions and the answer format. If even an
empty last user turn does not fit, the prompt is refused (``ValueError`` naming the row). A
plain-string prompt has no structure to keep: its last ``max_length`` tokens are used.
:func:`count_too_long` lets the trainer say at the start of a run how many prompts will be cut.
"""

from __future__ import annotations

import torch


def _chat_ids(tokenizer, messages, template_kwargs=None) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **(template_kwargs or {}))
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_ids(tokenizer, prompt, max_length: int, row: int = 0, template_kwargs=None) -> tuple[list[int], bool]:
    """``(ids, cut)`` of one prompt, at most ``max_length`` ids (see the module docstring); ``template_kwargs``: more
    arguments of the chat template (TRL's ``chat_template_kwargs``, e.g. ``enable_thinking``)."""
    if isinstance(prompt, str):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return ids[-max_length:], len(ids) > max_length
    if not isinstance(prompt, list):
        raise ValueError(f"prompt of row {row} must be a string or a list of chat messages, got "
                         f"{type(prompt).__name__}")
    ids = _chat_ids(tokenizer, prompt, template_kwargs)
    if len(ids) <= max_length:
        return ids, False
    last = max((i for i, m in enumerate(prompt) if m.get("role") == "user"), default=None)
    if last is None:
        raise ValueError(f"prompt of row {row}: {len(ids)} tokens > max_prompt_length={max_length} and no user turn "
                         "to shorten")
    content = tokenizer(prompt[last]["content"], add_special_tokens=False)["input_ids"]
    keep = len(content) - (len(ids) - max_length)
    while True:
        text = tokenizer.decode(content[len(content) - keep:]) if keep > 0 else ""
        ids = _chat_ids(tokenizer, [*prompt[:last], {**prompt[last], "content": text}, *prompt[last + 1:]],
                        template_kwargs)
        if len(ids) <= max_length:
            return ids, True
        if keep <= 0:
            raise ValueError(f"prompt of row {row}: even with an empty last user turn it has {len(ids)} tokens > "
                             f"max_prompt_length={max_length} (the system prompt and template alone are too long)")
        keep -= len(ids) - max_length  # re-tokenising the cut text can shift the count by a few tokens


def encode_prompts(tokenizer, prompts, max_length: int, device=None, template_kwargs=None):
    """Tokenise and left-pad a batch of prompts. Returns ``(ids, mask, n_cut)``.

    >>> from tarpo.models.tiny import char_tokenizer
    >>> tok = char_tokenizer()
    >>> ids, mask, n = encode_prompts(tok, ["abcdefgh", "xy"], max_length=5)
    >>> tok.decode(ids[0]), mask[1].tolist(), n
    ('defgh', [0, 0, 0, 1, 1], 1)
    """
    rows, n_cut = [], 0
    for i, prompt in enumerate(prompts):
        ids, cut = prompt_ids(tokenizer, prompt, max_length, i, template_kwargs)
        rows.append(ids)
        n_cut += cut
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device), n_cut


def count_too_long(tokenizer, prompts, max_length: int, template_kwargs=None) -> int:
    """How many prompts are longer than ``max_length`` tokens before cutting (any that cannot be
    cut to fit raise ``ValueError`` here, before training starts)."""
    n = 0
    for i, prompt in enumerate(prompts):
        n += prompt_ids(tokenizer, prompt, max_length, i, template_kwargs)[1]
    return n
