"""The CPU estimate's length probe (tarpo.runs.cpu_estimate.completion_lengths): a model that ends its
completions at once is estimated at their length, one that never ends at the run's full length."""

import torch

from tarpo.runs.cpu_estimate import PROBE_TOKENS, completion_lengths
from tarpo.models.tiny import char_tokenizer, tiny_causal_lm


def certain(token: int):
    """A tiny model whose next token is always ``token`` (its head: zero weights, a bias on ``token``)."""
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, "qwen2", hidden_size=32, layers=1, heads=2, kv_heads=1)
    head = torch.nn.Linear(32, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-1e4)
        head.bias[token] = 1e4
    model.lm_head = head
    return model


PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


def test_a_model_that_stops_at_once_is_estimated_at_its_length():
    model = certain(3).train()
    assert completion_lengths(model, PROMPTS, 1024, stop_ids=[3], pad_id=0, temperature=0.5) == [1, 1, 1]
    assert model.training  # left as it was


def test_a_row_still_running_when_the_probe_stops_counts_at_the_full_length():
    model = certain(4)
    assert completion_lengths(model, PROMPTS, 1024, stop_ids=[3], pad_id=0, temperature=0.5) == [1024] * 3
    assert completion_lengths(model, PROMPTS, 20, stop_ids=[3], pad_id=0, temperature=0.0) == [20] * 3
    assert PROBE_TOKENS < 1024  # the first call sampled PROBE_TOKENS tokens, not 1024
