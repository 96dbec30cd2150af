"""Getting the answer out of a completion (docs/algorithm.md §6).

The answer is the text after the **last** answer tag. For scoring (not for the training
reward) two fallbacks can be configured when no tag is present: the last ``\\boxed{}``
(brace-matched) and then the last number.

    >>> extract_answer("so 3+4 = 7 #### 7", "####")
    Extraction(answer='7', source='tag', tag_count=1)
    >>> extract_answer("the answer is \\\\boxed{\\\\frac{1}{2}}", "####", fallbacks=FALLBACKS)
    Extraction(answer='\\\\frac{1}{2}', source='boxed', tag_count=0)
    >>> extract_answer("it costs 1,200 dollars", "####", fallbacks=("number",))
    Extraction(answer='1,200', source='number', tag_count=0)
"""

from __future__ import annotations

import re
from typing import NamedTuple

FALLBACKS = ("boxed", "number")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_FENCE = re.compile(r"```python[^\n]*\n(.*?)(?:```|$)", re.DOTALL)


class Extraction(NamedTuple):
    answer: str | None
    source: str | None  # "tag", "boxed", "number" or None
    tag_count: int


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}``, braces matched; ``\\boxed 5`` too."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    if i < len(text) and text[i] == " ":
        m = re.match(r" ([^\s$]+)", text[i:])
        return m.group(1) if m else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None  # unbalanced


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def extract_answer(text: str, tag: str, fallbacks=()) -> Extraction:
    """Answer after the last ``tag`` (stripped), else the first configured fallback that finds one."""
    count = text.count(tag)
    if count:
        return Extraction(text.rsplit(tag, 1)[1].strip(), "tag", count)
    for name in fallbacks:
        if name not in FALLBACKS:
            raise ValueError(f"unknown answer fallback {name!r}; known: {FALLBACKS}")
        found = last_boxed(text) if name == "boxed" else last_number(text)
        if found is not None:
            return Extraction(found.strip(), name, 0)
    return Extraction(None, None, 0)


def extract_code(text: str) -> str | None:
    """The last fenced python block (an unclosed final fence runs to the end of the text)."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else None
