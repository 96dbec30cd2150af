"""Each token id's text piece, what answer-tag detection reads (docs/algorithm.md §1).

The answer tag (``####``, or "```python" for code) may be one token or span several, and may be split
across decode steps; :mod:`tarpo.engine.tag_automaton` finds it from the pieces of the vocabulary, one
table lookup per step, so the text is never re-decoded.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

_PIECE_FNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def token_piece_fn(tokenizer) -> Callable[[int], str]:
    """Text of one token id, memoised (a token's text never depends on its neighbours
    for an ASCII tag; byte-level pieces of multi-byte characters decode to U+FFFD, which
    never matches a tag). One function per tokenizer, so what is built from it once (the
    tag automaton of :mod:`tarpo.engine.static_decode`) is found again."""
    if tokenizer in _PIECE_FNS:
        return _PIECE_FNS[tokenizer]
    cache: dict[int, str] = {}

    def piece(tok: int) -> str:
        s = cache.get(tok)
        if s is None:
            s = cache[tok] = tokenizer.decode([tok], skip_special_tokens=False)
        return s

    _PIECE_FNS[tokenizer] = piece
    return piece
