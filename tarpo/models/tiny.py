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

from ..architectures import ARCHITECTURES

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


TINY_SHAPE = dict(hidden_size=64, layers=2, heads=4, kv_heads=2, tie_word_embeddings=False)
TINY_OPTIONAL = ("intermediate_size", "vocab_size")  # default: 4 x hidden_size; the tokenizer's size


def tiny_causal_lm(tokenizer, arch: str = "qwen2", seed: int = 0, **shape):
    """A random-init Qwen2 or Llama causal LM (fp32, eval mode, SDPA attention) of ``shape``, keywords of
    :data:`TINY_SHAPE` (its defaults) and :data:`TINY_OPTIONAL`."""
    if unknown := set(shape) - set(TINY_SHAPE) - set(TINY_OPTIONAL):
        raise TypeError(f"tiny_causal_lm: no shape setting {', '.join(sorted(unknown))} (see TINY_SHAPE)")
    s = {**TINY_SHAPE, **dict.fromkeys(TINY_OPTIONAL), **shape}
    cls_cfg, cls_model = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    config = cls_cfg(
        vocab_size=s["vocab_size"] or len(tokenizer), hidden_size=s["hidden_size"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        intermediate_size=s["intermediate_size"] or 4 * s["hidden_size"], max_position_embeddings=4096,
        tie_word_embeddings=s["tie_word_embeddings"], pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return cls_model(config).eval()


# The Qwen2.5-1.5B and 3B(-Instruct) configurations (tarpo.architectures): random weights of the real shape, for GPU
# checks; Qwen2Config's keywords, so without the model_type
QWEN25_15B, QWEN25_3B = ({k: v for k, v in ARCHITECTURES[name].items() if k != "model_type"}
                         for name in ("qwen2.5-1.5b", "qwen2.5-3b"))


def random_model_dir(root: str, config: dict = QWEN25_15B, dtype=torch.bfloat16, seed: int = 0,
                     arch: str = "qwen2") -> str:
    """Save a random-init Qwen2 (or, ``arch="llama"``, Llama) of ``config`` and a small :func:`bpe_tokenizer`
    to ``root``.

    The tokenizer's ids cover only the first few hundred of the model's; its pad
    (``<|endoftext|>``) and EOS (``<|im_end|>``) differ, as in Qwen2.5-Instruct: Unsloth's loader
    adds a pad token (and resizes the vocabulary) when they are the same. A byte-level BPE,
    because transformers loads a tokenizer saved beside a Qwen2 config as ``Qwen2Tokenizer``."""
    torch.manual_seed(seed)
    cls_cfg, cls_model = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    model = cls_model(cls_cfg(**{"pad_token_id": 0, "eos_token_id": 2, "bos_token_id": None, **config}))
    model = model.to(dtype)
    model.save_pretrained(root)
    corpus = [f"question {i}: what is {i} plus {i + 1}? #### {2 * i + 1}" for i in range(200)]
    bpe_tokenizer(corpus, vocab_size=400).save_pretrained(root)
    return root


def left_padded_prompts(batch: int, length: int, vocab: int, pad_token_id: int, seed: int = 0, low: int = 10,
                        shortest: int | None = None):
    """Random prompts ``[batch, length]``, left-padded to ``length``: row lengths spread evenly from
    ``length`` down to ``shortest`` (default ``length // 4``), as a batch of real prompts would be.
    Returns ``(ids, mask)``; padded positions hold ``pad_token_id``.

    >>> ids, mask = left_padded_prompts(3, 8, 100, 0)
    >>> mask.sum(1).tolist(), bool((ids[mask == 0] == 0).all())
    ([8, 5, 2], True)
    """
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(low, vocab, (batch, length), generator=g)
    shortest = max(1, length // 4) if shortest is None else shortest
    lengths = [length - (length - shortest) * r // max(batch - 1, 1) for r in range(batch)]
    mask = (torch.arange(length)[None] >= length - torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = pad_token_id
    return ids, mask


def synthetic_rollout(vocab: int, G: int, P: int, T: int, k: int, device, seed: int = 0):
    """A recorded batch for benchmarks and checks: G rows of P prompt and T completion tokens,
    ~10% soft steps with random top-k mixtures, every step but the last a thinking step."""
    from ..engine.rollout import Rollout

    g = torch.Generator(device="cpu").manual_seed(seed)
    prompt_ids = torch.randint(10, vocab, (G, P), generator=g)
    token_ids = torch.randint(10, vocab, (G, T), generator=g)
    is_soft = torch.rand(G, T, generator=g) < 0.1
    is_soft[:, -1] = False
    decided = torch.ones(G, T, dtype=torch.bool)
    decided[:, -1] = False
    w = torch.rand(G, T, k, generator=g)
    rec = dict(prompt_ids=prompt_ids, prompt_mask=torch.ones(G, P, dtype=torch.long), token_ids=token_ids,
               completion_mask=torch.ones(G, T, dtype=torch.bool), is_soft=is_soft, decided=decided,
               soft_ids=torch.randint(10, vocab, (G, T, k), generator=g), soft_weights=w / w.sum(-1, keepdim=True),
               p_soft=torch.full((G, T), 0.1), entropy=torch.zeros(G, T), logp=torch.zeros(G, T),
               soft_inputs=torch.zeros(G, T, 0), ended_with_eos=torch.zeros(G, dtype=torch.bool))
    return Rollout(**{k_: v.to(device) for k_, v in rec.items()})
