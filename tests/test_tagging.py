"""The per-row tag tracker that the tensor automaton is checked against (tests/oracles.py), and the token
pieces it reads."""

from oracles import TagTracker
from tarpo.engine.tagging import token_text_fn

PIECES = ["a", "#", "##", "###", "####", " ", "b####c", "\n"]


def run(seq, tag="####"):
    t = TagTracker(PIECES.__getitem__, tag, 1)
    return [t.update([0], [i])[0] for i in seq], t.thinking[0]


def test_single_token_tag():
    assert run([0, 4, 0]) == ([False, True, False], False)


def test_tag_split_over_steps_and_tokens():
    assert run([0, 1, 1, 2, 0]) == ([False, False, False, True, False], False)  # # # ##
    assert run([3, 1]) == ([False, True], False)                               # ### #
    assert run([2, 5, 2]) == ([False, False, False], True)                     # "## ##" is no tag


def test_tag_inside_a_token_and_multi_token_tag_text():
    assert run([6]) == ([True], False)
    seq = [PIECES.index(c) if c in PIECES else 0 for c in "```"]
    assert run(seq, tag="```python")[1] is True


def test_rows_are_independent_and_later_tokens_ignored():
    t = TagTracker(PIECES.__getitem__, "####", 3)
    assert t.update([0, 1, 2], [4, 1, 0]) == [True, False, False]
    assert t.update([1, 2], [3, 4]) == [True, True]
    assert t.update([0, 1], [4, 4]) == [False, False]
    assert t.thinking == [False, False, False]


def test_real_tokenizer_pieces(tokenizer):
    token_text = token_text_fn(tokenizer)
    ids = tokenizer("x ## ## #", add_special_tokens=False)["input_ids"] + \
        tokenizer("###", add_special_tokens=False)["input_ids"]
    t = TagTracker(token_text, "####", 1)
    done = [t.update([0], [i])[0] for i in ids]
    assert done.count(True) == 1 and done[-1] is True
