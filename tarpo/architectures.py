"""The published architectures of the model presets: each model's ``config.json`` on the hub
(``<hub_id>/config.json``), as the keywords of its transformers config, ``model_type`` included.

One table, read by the launchers' model presets (:data:`tarpo.runs.presets.MODELS`, whose memory
:mod:`tarpo.engine.memory_plan` plans before any weight loads) and by the random models of a real shape
(:data:`tarpo.models.tiny.QWEN25_15B`, :data:`tarpo.models.tiny.QWEN25_3B`) of the GPU checks and benchmarks.

    >>> ARCHITECTURES["qwen2.5-3b"]["num_hidden_layers"], ARCHITECTURES["llama3.1-8b"]["model_type"]
    (36, 'llama')
"""

from __future__ import annotations

_QWEN = dict(model_type="qwen2", max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6)

ARCHITECTURES = {
    "qwen2.5-1.5b": dict(_QWEN, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-3b": dict(_QWEN, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(_QWEN, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "qwen2.5-14b": dict(_QWEN, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48, num_attention_heads=40,
                        num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False),
    "qwen2.5-32b": dict(_QWEN, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                        num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False),
    # beyond the paper: the small real model of the CPU learning check (tarpo.models.offline makes it offline)
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0),
    "llama3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False,
                        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=8192)),
}
