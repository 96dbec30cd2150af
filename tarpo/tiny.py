"""Tiny offline models for tests, benchmarks and the CPU demo (no hub access).

``char_tokenizer()`` is a character-level BPE tokenizer over printable ASCII with a few
merges (so multi-character tokens like ``##`` exist); ``bpe_tokenizer(corpus)`` trains a
small byte-level BPE in memory (digits always split one per token). Both have Qwen-style
special tokens and a ChatML chat template. ``tiny_causal_lm()`` builds a random Qwen2 or
Llama model from a config sized to that vocabulary.
"""

from __future__ import annotations

import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("#", "#"), ("##", "##"), ("\n", "\n"), (" ", " ")]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer() -> PreTrainedTokenizerFast:
    chars = sorted(set(string.printable) - set("\r\x0b\x0c"))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    for a, b in MERGES:
        vocab.setdefault(a + b, len(vocab))
    core = Tokenizer(models.BPE(vocab=vocab, merges=MERGES, unk_token="<|endoftext|>"))
    core.decoder = decoders.Fuse()
    return _wrap(core)


def _wrap(core: Tokenizer) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"], padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def bpe_tokenizer(corpus: list[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``corpus`` in memory (deterministic for a given corpus)."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(corpus, trainer=trainer)
    return _wrap(core)


def tiny_causal_lm(tokenizer, arch: str = "qwen2", hidden_size: int = 64, layers: int = 2, heads: int = 4,
                   kv_heads: int = 2, intermediate_size: int | None = None, vocab_size: int | None = None,
                   seed: int = 0, tie_word_embeddings: bool = False):
    """A random-init Qwen2 or Llama causal LM (fp32, eval mode, eager attention)."""
    cls_cfg, cls_model = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    config = cls_cfg(
        vocab_size=vocab_size or len(tokenizer), hidden_size=hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=intermediate_size or 4 * hidden_size, max_position_embeddings=4096,
        tie_word_embeddings=tie_word_embeddings, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return cls_model(config).eval()
