"""Per-row phase tracking over generated ids: thinking -> answer -> done (docs/algorithm.md §1).

The answer tag (``####``, or "```python" for code) may be one token or span several,
and may be split across decode steps. Each row keeps only the last ``len(tag) - 1``
characters of its text; a step appends the new token's text piece and looks for the
tag in that short window. The work per step is O(len(tag)) per live row: the text is
never re-decoded.

    >>> t = TagTracker(["a", "##", "#", "####", "x"].__getitem__, "####", batch_size=1)
    >>> [t.update([0], [i])[0] for i in (0, 1, 2, 2, 4)]
    [False, False, False, True, False]

(``update`` returns, per given row, whether this very token completed the tag.)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence


class TagTracker:
    def __init__(self, piece: Callable[[int], str], tag: str, batch_size: int):
        self.piece = piece
        self.tag = tag
        self.keep = len(tag) - 1
        self.tails = [""] * batch_size
        self.thinking = [True] * batch_size

    def update(self, rows: Sequence[int], token_ids: Sequence[int]) -> list[bool]:
        """Feed token ``token_ids[j]`` to row ``rows[j]``. Returns, per j, "tag completed now"."""
        done_now = [False] * len(rows)
        for j, (r, tok) in enumerate(zip(rows, token_ids)):
            if not self.thinking[r]:
                continue
            window = self.tails[r] + self.piece(tok)
            if self.tag in window:
                self.thinking[r] = False
                done_now[j] = True
            self.tails[r] = window[-self.keep:] if self.keep else ""
        return done_now


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
