"""What several test modules share: where the benchmark files are, the toy reward, data set and trainer
settings, the tiny saved system's eval command, one completion's grade, and small test doubles around
:class:`tarpo.engine.backbone.Backbone` (one of them the Unsloth backend's hook mechanism on the transformers path,
:class:`HookedBackbone`)."""

import os

import pytest
import torch

from tarpo.engine.backbone import Backbone
from tarpo.engine.tagging import token_text_fn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the real benchmark files (each with a SOURCE.md), beside the checkout; TARPO_DATA_DIR points elsewhere
DATA = os.environ.get("TARPO_DATA_DIR") or os.path.join(os.path.dirname(ROOT), "shared", "data")


def needs(task: str):
    """Skip unless the benchmark folder ``DATA/<task>`` is there."""
    return pytest.mark.skipif(not os.path.isdir(os.path.join(DATA, task)),
                              reason=f"{os.path.join(DATA, task)} is not beside the checkout")


needs_data = needs("gsm8k")

# (task, path under DATA, split, rows) of the benchmark files the loaders must read whole
COUNTS = [
    ("gsm8k", "gsm8k", "train", 7473), ("gsm8k", "gsm8k", "test", 1319),
    ("gsm8k", "gsm8k/soft_thinking_gsm8k.jsonl", None, 1319),
    ("math", "math", "train", 7500), ("math", "math", "test", 5000),
    ("math500", "math500", "test", 500), ("math500", "math500/soft_thinking_math500.jsonl", None, 500),
    ("amc23", "amc23", "test", 40), ("amc23", "amc23/soft_thinking_amc23.jsonl", None, 40),
    ("aime24", "aime24", "test", 30), ("aime25", "aime25/soft_thinking_aime2025.jsonl", None, 30),
    ("olympiadbench", "olympiadbench", "test", 675),
    ("arc_challenge", "arc_challenge", "test", 1172), ("humaneval", "humaneval", "test", 164),
]

# the tiny Qwen2 shape of the subprocess workers' runs (tests/workers/backend_worker.py)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=512, max_position_embeddings=2048, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)
# ... and a tiny Llama-3.1: untied head, llama3 rope scaling (tarpo.models.tiny.random_model_dir(..., arch="llama"))
TINY_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048, rms_norm_eps=1e-5,
                  tie_word_embeddings=False,
                  rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                                   "rope_theta": 500000.0})


def score(completion: str, example: dict, grader: str | None = None, **kwargs) -> float:
    """One completion's grade (:func:`tarpo.tasks.graders.grade_batch` and its keyword arguments)."""
    from tarpo.tasks.graders import grade_batch

    return grade_batch([completion], [example], grader, **kwargs)[0].score


def letter_reward(prompts, completions, **kwargs):
    """A dense toy reward with spread inside every group: share of vowels."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]


def make_dataset(n=8):
    import datasets

    return datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"question {i}?"}], "answer": str(i)} for i in range(n)])


def make_args(tmp_path, **overrides):
    """A TarpoConfig for a few quick CPU steps of a tiny model; ``overrides`` replace any field."""
    from tarpo.config import TarpoConfig

    kw = dict(output_dir=str(tmp_path / "run"), bf16=False, per_device_train_batch_size=4, num_generations=4,
              max_completion_length=12, max_steps=3, logging_steps=1, report_to="none",
              gradient_checkpointing=False, save_strategy="no", learning_rate=1e-2, router_lr=1e-1,
              action_bias=[0.5, 0.0], lora_r=4, lora_alpha=8, beta=0.05, seed=0, data_seed=0)
    kw.update(overrides)
    return TarpoConfig(**kw)


def eval_args(tiny, out, *extra):
    """``tarpo eval`` of the tiny saved system (the ``tiny`` fixture) on 20 real GSM8K questions."""
    model, adapter = tiny
    return ["eval", "--model", model, "--adapter", adapter, "--tasks", "gsm8k", "--data-dir", DATA,
            "--limit", "20", "--n", "4", "--max-new-tokens", "12", "--batch-size", "8", "--out", str(out), *extra]


class BiasedBackbone(Backbone):
    """Adds a fixed bias to every logit vector (e.g. to make EOS likely)."""

    def __init__(self, model, bias):
        super().__init__(model)
        self.bias = bias

    def logits(self, hidden):
        return super().logits(hidden) + self.bias.to(hidden.dtype)


class ScriptedBackbone(Backbone):
    """Forces row r to emit ``script[r][t]`` at decode step t (batch rows must not be compacted)."""

    def __init__(self, model, script, vocab_size):
        super().__init__(model)
        self.step, self.script, self.V = 0, script, vocab_size
        self.seen = []

    def logits(self, hidden):
        out = super().logits(hidden)
        self.seen.append(out.detach().clone())
        bias = torch.zeros(len(self.script), self.V)
        for r, seq in enumerate(self.script):
            bias[r, seq[min(self.step, len(seq) - 1)]] = 1e4
        self.step += 1
        return out + bias


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder's final norm (``model.model.norm`` for Qwen2 and Llama): its output is the ``lm_head`` input."""
    from tarpo.engine.backbone import unwrap

    return unwrap(model).get_decoder().norm


class HiddenCapture:
    """Keep the output of a module (the final norm) from its last call."""

    def __init__(self, module: torch.nn.Module):
        self.value = None
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.value = output[0] if isinstance(output, tuple) else output

    def take(self) -> torch.Tensor:
        value, self.value = self.value, None
        return value

    def remove(self) -> None:
        self.handle.remove()


class HookedBackbone(Backbone):
    """A :class:`Backbone` whose decode steps call the whole model with ``input_ids``, as Unsloth's decode path
    is called: the soft inputs go in through :class:`tarpo.models.backends.EmbeddingOverride` (all rows replaced,
    which is identical for hard rows) and ``h`` is read from the final norm (:class:`HiddenCapture`, standing in
    for the decode patch). Without ``token_ids`` (the training forward) it is the plain backbone."""

    def __init__(self, model: torch.nn.Module):
        from tarpo.models.backends import EmbeddingOverride

        super().__init__(model)
        self.override = EmbeddingOverride(self.embedding)
        self.capture = HiddenCapture(final_norm(model))

    def hidden(self, inputs_embeds, attention_mask, position_ids, cache=None, token_ids=None) -> torch.Tensor:
        if token_ids is None:
            return super().hidden(inputs_embeds, attention_mask, position_ids, cache)
        self.override.set(inputs_embeds)
        self.model(input_ids=token_ids, attention_mask=attention_mask, position_ids=position_ids,
                   past_key_values=cache, use_cache=cache is not None, logits_to_keep=1)
        self.override.pending = None
        return self.capture.take()

    def close(self) -> None:
        self.override.remove()
        self.capture.remove()


def encode_prompts(tokenizer, texts):
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def policy_of(backbone, tokenizer, router=None, soft_input=None, token_text=None):
    """The rollout's :class:`tarpo.engine.step.Policy` of a test tokenizer: its texts (or ``token_text``), EOS
    and pad; ``soft_input`` None: the top-k mixture."""
    from tarpo.engine.soft_input import TOP_K_MIXTURE
    from tarpo.engine.step import Policy
    return Policy(backbone, token_text or token_text_fn(tokenizer), [tokenizer.eos_token_id],
                  tokenizer.pad_token_id, router, soft_input or TOP_K_MIXTURE)


def stand_in_unsloth_decode(model, monkeypatch):
    """Make ``model`` look like one that ``tarpo.patches.apply`` prepared, on the transformers path.

    What the real patch does is stood in for piece by piece: the backend marker on the
    ``*ForCausalLM``; a class ``forward`` carrying the decode patch's marker; ``h_t`` left on
    the model as ``_tarpo_hidden`` at each call (here by a hook on the final norm); Unsloth's
    inference-mode switch made a no-op. Returns the hook handle (``.remove()`` stops the
    hidden state being left, as a dropped patch would).
    """
    import contextlib

    from tarpo.engine.backbone import unwrap
    from tarpo.models.backends import UnslothBackbone
    from tarpo.patches import BACKEND_MARKER

    base = unwrap(model)
    original = type(base).forward

    def forward(self, *args, **kwargs):
        return original(self, *args, **kwargs)
    forward._tarpo_decode_hidden = True
    monkeypatch.setattr(type(base), "forward", forward)
    monkeypatch.setattr(UnslothBackbone, "inference_mode", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(base, BACKEND_MARKER, "unsloth", raising=False)
    return final_norm(model).register_forward_hook(lambda m, a, out: setattr(base, "_tarpo_hidden", out))


def free_port() -> int:
    """A TCP port nobody listens on now: for ``accelerate launch --main_process_port``, so that runs on gloo
    started by tests in parallel (pytest-xdist) never meet on accelerate's default port 29500."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def loss_of(settings, **tensors):
    """:func:`tarpo.training.objective.tarpo_loss` of keyword tensors: the current policy's (the fields of
    :class:`tarpo.training.scoring.StepScores`) and the batch's (:class:`tarpo.training.objective.LossBatch`)."""
    from dataclasses import fields

    from tarpo.training.objective import LossBatch, tarpo_loss
    from tarpo.training.scoring import StepScores

    names = {f.name for f in fields(StepScores)}
    scores = StepScores(**{k: v for k, v in tensors.items() if k in names})
    return tarpo_loss(settings, scores, LossBatch(**{k: v for k, v in tensors.items() if k not in names}))


def recorded_builds(monkeypatch) -> list:
    """The merge level of every build of the compiled engine's decode weights from now on
    (``tarpo.engine.decoder_tensors.build``, where tarpo.engine.decode_weights looks it up)."""
    from tarpo.engine import decoder_tensors

    built = []
    build = decoder_tensors.build
    monkeypatch.setattr(decoder_tensors, "build", lambda model, merge: built.append(merge) or build(model, merge))
    return built


def one_step_run(root, **fields):
    """A tiny Qwen2 saved in ``root/model``, trained one step of 4 completions of 6 tokens (rewards 0, 1, 0, 1) with
    the TarpoConfig ``fields`` given (a routing, its settings), its adapter saved in ``root/adapter``: what
    ``tarpo eval``, ``tarpo case`` and ``tarpo generate`` read. Returns ``root``."""
    import datasets

    from tarpo.config import TarpoConfig
    from tarpo.models.tiny import char_tokenizer, tiny_causal_lm
    from tarpo.training.trainer import TarpoTrainer
    tok = char_tokenizer()
    tiny_causal_lm(tok, "qwen2", seed=0).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    args = TarpoConfig(output_dir=str(root / "run"), per_device_train_batch_size=4, num_generations=4,
                       max_completion_length=6, max_steps=1, report_to="none", save_strategy="no", bf16=False,
                       lora_r=4, lora_alpha=8, **fields)
    data = datasets.Dataset.from_list([{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(4)])
    trainer = TarpoTrainer(str(root / "model"), lambda completions, **kw: [0.0, 1.0] * (len(completions) // 2),
                           args=args, train_dataset=data)
    trainer.train()
    trainer.save_model(str(root / "adapter"))
    return root
