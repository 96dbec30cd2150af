"""Slow, plainly correct references that the package's fast code is checked against.

:class:`TagTracker` follows the answer tag (``####``, or "```python" for code) over generated ids one token at
a time, in Python: the reference of the tensor automaton :mod:`tarpo.engine.tag_automaton` that both rollout
engines run (docs/algorithm.md §1). Each row keeps only the last ``len(tag) - 1`` characters of its text; a
step appends the new token's text and looks for the tag in that short window, so a tag split over steps
or inside one token is found.

    >>> t = TagTracker(["a", "##", "#", "####", "x"].__getitem__, "####", batch_size=1)
    >>> [t.update([0], [i])[0] for i in (0, 1, 2, 2, 4)]
    [False, False, False, True, False]

(``update`` returns, per given row, whether this very token completed the tag.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TagTracker:
    def __init__(self, token_text: Callable[[int], str], tag: str, batch_size: int):
        self.token_text = token_text
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
            window = self.tails[r] + self.token_text(tok)
            if self.tag in window:
                self.thinking[r] = False
                done_now[j] = True
            self.tails[r] = window[-self.keep:] if self.keep else ""
        return done_now
