import itertools
import random
import string
import time

import pytest
import torch

from oracles import TagTracker
from tarpo.engine.tag_automaton import build, step
from tarpo.engine.tagging import token_text_fn
from tarpo.models.tiny import bpe_tokenizer, char_tokenizer

TAGS = ["####", "```python"]


def tokenizer_pieces(tokenizer, vocab_size: int | None = None) -> list[str]:
    """Each id's text as the engine reads it (``token_text_fn``); ids from ``len(tokenizer)`` up to
    ``vocab_size`` (a model's padded vocabulary) get "" (what :func:`tarpo.engine.tag_automaton.tables` builds
    from)."""
    token_text = token_text_fn(tokenizer)
    n = len(tokenizer)
    return [token_text(i) if i < n else "" for i in range(max(n, vocab_size or 0))]


def reference(pieces, tag):
    """Character-level truth: from state s the text is tag[:s] + token_text."""
    m = len(tag)
    nxt, hit = [], []
    for s in range(m):
        texts = [tag[:s] + p for p in pieces]
        hit.append([tag in t for t in texts])
        nxt.append([max(k for k in range(m) if t.endswith(tag[:k])) for t in texts])
    return nxt, hit


def check_against_reference(pieces, tag):
    nxt, hit = build(pieces, tag)
    assert nxt.dtype == torch.long and hit.dtype == torch.bool and nxt.shape == (len(tag), len(pieces))
    ref_nxt, ref_hit = reference(pieces, tag)
    assert nxt.tolist() == ref_nxt and hit.tolist() == ref_hit


@pytest.mark.parametrize("tag,alphabet", [("####", "#x"), ("abab", "abx"), ("aab", "abx"), ("a", "ax"),
                                          ("aaa", "a b")])
def test_tables_match_char_level_reference_exhaustively(tag, alphabet):
    pieces = ["".join(t) for n in range(9) for t in itertools.product(alphabet, repeat=n)]
    check_against_reference(pieces, tag)


def test_tables_match_reference_on_long_and_unicode_pieces():
    rng = random.Random(0)
    alphabet = "`pythonx#\n é\ufffd"
    pieces = ["".join(rng.choices(alphabet, k=rng.randint(0, 40))) for _ in range(3000)]
    pieces += ["```python", "x```python```py", "``" * 20 + "`python", "#" * 30, "a####b", "\ud800#"]
    for tag in TAGS:
        check_against_reference(pieces, tag)


def run_steps(pieces, tag, seqs):
    """Per-step thinking flags from TagTracker and from the tables, both [steps][rows]."""
    tracker = TagTracker(pieces.__getitem__, tag, len(seqs))
    nxt, hit = build(pieces, tag)
    state = torch.zeros(len(seqs), dtype=torch.long)
    thinking = torch.ones(len(seqs), dtype=torch.bool)
    ours, theirs = [], []
    for tokens in zip(*seqs):
        tracker.update(range(len(seqs)), tokens)
        state, hit_now = step(state, torch.tensor(tokens), nxt, hit)
        thinking &= ~hit_now
        theirs.append(list(tracker.thinking))
        ours.append(thinking.tolist())
    return ours, theirs


def hand(seq, tag="####"):
    pieces = ["a", "#", "##", "###", "####", " ", "a####b", "#####", "", "```", "py", "thon", "``", "`python"]
    ours, theirs = run_steps(pieces, tag, [[pieces.index(p) for p in seq]])
    assert ours == theirs
    return [row[0] for row in ours]


def test_hand_cases():
    assert hand(["a", "##", "##", "a"]) == [True, True, False, False]                # split over steps
    assert hand(["a####b", "a"]) == [False, False]                                    # inside one token
    assert hand(["a", "#####"]) == [True, False]                                      # longer run
    assert hand(["#", " ", "##", "#"]) == [True, True, True, True]                    # "# ###" no tag
    assert hand(["###", "", "#"]) == [True, True, False]                              # empty text
    assert hand(["##", "###"]) == [True, False]                                       # overlap
    assert hand(["``", "```", "py", "thon"], "```python") == [True, True, True, False]
    assert hand(["```", "py", "```", "`python"], "```python") == [True, True, True, False]
    assert hand(["``", "`python"], "```python") == [True, False]


CORPUS = [
    "Let me think. 12 + 30 = 42, so #### 42", "## Heading\n# comment\n#### 7", "x####y ##### ###",
    "```python\ndef f(x):\n    return x\n```", "Here is code:\n```python\nprint('hi')\n```\n",
    "```py is not ```python but `python` is close", "tonight the python hopped on the typhoon",
    "Café → naïve ∑ 数学 ####", "```\n``` ``python``\n", "#### #### ## ## # #",
] * 20


@pytest.fixture(scope="module", params=["char", "bpe"])
def real_tokenizer(request):
    return char_tokenizer() if request.param == "char" else bpe_tokenizer(CORPUS)


@pytest.mark.parametrize("tag", TAGS)
def test_random_streams_match_tag_tracker(real_tokenizer, tag):
    """300 streams of 50 tokens, biased towards the tag's characters, tag fragments (at times
    with an empty text inside) and empty pieces; same thinking flags at every step."""
    tok = real_tokenizer
    pieces = tokenizer_pieces(tok, vocab_size=len(tok) + 3)           # padded ids -> ""
    rng = random.Random(TAGS.index(tag) * 1000 + len(pieces))
    hot = [i for i, p in enumerate(pieces) if set(p) & set(tag)]
    empty = [i for i, p in enumerate(pieces) if p == ""]             # they must keep the state
    frags = ["####", "##", "#", "# ##", "###", "```python", "```", "``", "```py", "python", "`python",
             "```pytho", "```\n", "a#### b", " ```python\n", "##", "``", "`"]
    frag_ids = [tok(f, add_special_tokens=False)["input_ids"] for f in frags]
    f, h = {"####": (0.04, 0.1), "```python": (0.1, 0.4)}[tag]      # so that about half the rows hit
    seqs = []
    for _ in range(300):
        seq = []
        while len(seq) < 50:
            r = rng.random()
            if r < f:
                ids = [i for _ in range(rng.randint(1, 2)) for i in rng.choice(frag_ids)]
                if rng.random() < 0.4:
                    ids.insert(rng.randrange(len(ids) + 1), rng.choice(empty))
                seq += ids
            else:
                seq.append(rng.choice(empty) if r < f + 0.1 else rng.choice(hot) if r < f + 0.1 + h
                           else rng.randrange(len(pieces)))
        seqs.append(seq[:50])
    ours, theirs = run_steps(pieces, tag, seqs)
    assert ours == theirs
    done = sum(not t for t in theirs[-1])
    assert 30 < done < 290, done                                      # the tag appears, but not always


def test_build_on_150k_synthetic_vocab():
    rng = random.Random(0)
    alphabet = string.ascii_letters + string.digits + " #`\n\u0120"
    pieces = ["".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(150_000)]
    pieces[:4] = ["", "<|im_end|>", "#" * 200, "```python" * 3]
    for tag in TAGS:
        t0 = time.perf_counter()
        nxt, hit = build(pieces, tag)
        print(f"build {tag!r} on {len(pieces)} pieces: {time.perf_counter() - t0:.3f}s")
        sample = rng.sample(range(len(pieces)), 2000) + [0, 1, 2, 3]
        ref_nxt, ref_hit = reference([pieces[i] for i in sample], tag)
        assert nxt[:, sample].tolist() == ref_nxt and hit[:, sample].tolist() == ref_hit


def test_step_compiles_without_graph_break():
    nxt, hit = build(["a", "##", "#", "####", "x", ""], "####")
    compiled = torch.compile(step, fullgraph=True, backend="eager")  # fullgraph raises on a break
    state = torch.zeros(3, dtype=torch.long)
    for tokens in ([1, 2, 0], [1, 2, 3], [5, 2, 4]):
        tokens = torch.tensor(tokens)
        got, want = compiled(state, tokens, nxt, hit), step(state, tokens, nxt, hit)
        assert all(torch.equal(a, b) for a, b in zip(got, want))  # exact: integer states and booleans
        state = got[0]
