"""Answer-tag detection as a tensor automaton, the same in both rollout engines (static shapes).

``build(pieces, tag)`` turns a vocabulary's text pieces into two tables, once per
(tokenizer, tag): ``next_state[S, V]`` and ``hit[S, V]`` with ``S = len(tag)``. A row's
state is the length of the longest suffix of its text that is a proper prefix of the
tag (a KMP automaton over characters, so a tag split across tokens, or inside one
token, is found). A decode step is then pure indexing, with no host sync::

    state, hit_now = step(state, tokens, next_state, hit)
    thinking = thinking & ~hit_now        # sticky: "thinking until the tag, once"

After a hit the state carries on as KMP would, so a later tag hits again; that does not
matter to the caller, whose ``thinking`` flag is sticky ("completed the tag at this step" is
``hit_now & thinking``). An empty token text (special tokens decode to text, but ids past the tokenizer decode
to "") leaves the state as it is and never hits. tests/test_tag_automaton.py checks the tables against a
character-level reading and whole token streams against a per-row text tracker (tests/oracles.py).

    >>> nxt, hit = build(["a", "##", "#", "####", "x", ""], "####")
    >>> state, done = torch.zeros(1, dtype=torch.long), []
    >>> for tok in (0, 1, 5, 2, 2, 4):     # a ## "" # # x  ->  the tag ends at the 5th token
    ...     state, h = step(state, torch.tensor([tok]), nxt, hit)
    ...     done.append(bool(h))
    >>> done
    [False, False, False, False, True, False]
    >>> nxt[:, 3].tolist(), hit[:, 3].tolist()   # "####" from any state: hit, then state 3
    ([3, 3, 3, 3], [True, True, True, True])
"""

from __future__ import annotations

import weakref

import numpy as np
import torch


def _char_dfa(tag: str) -> tuple[list[list[int]], int]:
    """KMP DFA over character classes (0 = not a tag char, k = k-th distinct tag char).
    Rows 0..m (m = the tag just completed); returns it and fail(m), the state after a hit."""
    chars = sorted(set(tag))
    cls = [chars.index(c) + 1 for c in tag]
    m, k = len(tag), len(chars) + 1
    dfa = [[0] * k for _ in range(m + 1)]
    dfa[0][cls[0]] = 1
    x = 0  # the state the text tag[1:s] leads to from 0 (the failure state of s)
    for s in range(1, m + 1):
        dfa[s] = list(dfa[x])
        if s < m:
            dfa[s][cls[s]] = s + 1
            x = dfa[x][cls[s]]
    return dfa, x


def build(pieces: list[str], tag: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables ``next_state`` (long) and ``hit`` (bool), both ``[len(tag), len(pieces)]``.

    Every piece runs through the char DFA from all S states at once, one character
    column per step. Only a piece's first and last ``len(tag) - 1`` characters can
    interact with the state (a match reaching back before the token's text starts within its
    head; the state after it lies within its tail), so a long piece is cut to
    head + "\\0" + tail, and ``tag in p`` gives the matches wholly inside it.
    """
    if not tag or "\0" in tag:
        raise ValueError(f"unsupported tag {tag!r}")
    m = len(tag)
    dfa, fail_m = _char_dfa(tag)
    short = [p if len(p) <= 2 * m - 1 else p[:m - 1] + "\0" + p[len(p) - m + 1:] for p in pieces]
    inside = torch.tensor([tag in p for p in pieces], dtype=torch.bool)

    # Characters -> class ids in a padded [V, L] matrix; padding is class `pad`, a self-loop.
    lengths = np.fromiter(map(len, short), dtype=np.int64, count=len(short))
    cps = np.frombuffer("".join(short).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    pad = len(dfa[0])
    cls = np.zeros(len(cps), dtype=np.int64)
    for k, ch in enumerate(sorted(set(tag))):
        cls[cps == ord(ch)] = k + 1
    width = max(int(lengths.max(initial=0)), 1)
    mat = np.full((len(short), width), pad, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    rows = np.repeat(np.arange(len(short)), lengths)
    mat[rows, np.arange(len(cps)) - np.repeat(starts, lengths)] = cls

    delta = torch.cat([torch.tensor(dfa), torch.arange(m + 1)[:, None]], dim=1)  # + pad column
    mat = torch.from_numpy(mat)
    state = torch.arange(m)[:, None].expand(m, len(short)).contiguous()
    hit = inside[None, :].expand(m, -1).clone()
    for j in range(width):
        state = delta[state, mat[:, j]]
        hit |= state == m
    return torch.where(state == m, fail_m, state), hit


def step(state: torch.Tensor, tokens: torch.Tensor, next_state: torch.Tensor,
         hit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step for a batch: ``(next_state[state, tokens], hit[state, tokens])``."""
    return next_state[state, tokens], hit[state, tokens]


_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def tables(token_text, tag: str, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`build`'s tables for a token-text function (:func:`tarpo.engine.tagging.token_text_fn`) on
    ``device``, built once (it decodes every id: a few seconds for a 150k vocabulary) and kept while
    ``token_text`` lives."""
    cached = _TABLES.setdefault(token_text, {})
    key = (tag, vocab, str(device))
    if key not in cached:
        nxt, hit = build([token_text(i) for i in range(vocab)], tag)
        cached[key] = (nxt.to(device), hit.to(device))
    return cached[key]
