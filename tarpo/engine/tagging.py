"""Each token id's text, what answer-tag detection reads (docs/algorithm.md §1).

The answer tag (``####``, or "```python" for code) may be one token or span several, and may be split
across decode steps; :mod:`tarpo.engine.tag_automaton` finds it from the pieces of the vocabulary, one
table lookup per step, so the text is never re-decoded.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

_TOKEN_TEXT_FNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def token_text_fn(tokenizer) -> Callable[[int], str]:
    """Text of one token id, memoised (a token's text never depends on its neighbours
    for an ASCII tag; byte-level pieces of multi-byte characters decode to U+FFFD, which
    never matches a tag). One function per tokenizer, so what is built from it once (the
    tag automaton of :mod:`tarpo.engine.static_decode`) is found again."""
    if tokenizer in _TOKEN_TEXT_FNS:
        return _TOKEN_TEXT_FNS[tokenizer]
    cache: dict[int, str] = {}

    def token_text(tok: int) -> str:
        s = cache.get(tok)
        if s is None:
            s = cache[tok] = tokenizer.decode([tok], skip_special_tokens=False)
        return s

    _TOKEN_TEXT_FNS[tokenizer] = token_text
    return token_text
