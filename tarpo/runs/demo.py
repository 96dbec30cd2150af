"""The CPU testbed: the whole method on a tiny model, end to end, in minutes on a CPU.

1. **Warm start** (cached): a byte-level BPE tokenizer trained in memory on the
   synthetic arithmetic task (:mod:`tarpo.tasks.synthetic`) and its system prompt, and a small
   random Qwen2 model taught the answer format by a short supervised phase, so that RL
   starts from rewards that are neither all 0 nor all 1.
2. **RL**: GRPO (routing ``hard``) and TARPO (learned routing) with :class:`TarpoTrainer`,
   same data, seed and hyper-parameters.
3. **Evaluation**: CoT (the warm-started model), GRPO and TARPO on the test split,
   ``n`` samples per question, with :mod:`tarpo.evaluation.sample` and the task's grader.

``python -m tarpo.runs.demo --help`` lists the settings; ``run_demo.sh`` sets them as shell
variables. The run folder holds ``config.json``, each run's ``metrics.jsonl``,
``curves.png`` (training curves), ``table.md`` and ``summary.json``.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import multiprocessing
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_callback import PrinterCallback

from ..config import TarpoConfig, add_flags, default
from ..engineering_fields import ENGINES
from ..evaluation.plot import plot_runs
from ..atomic_files import publish_folder, write_json_atomic, write_jsonl_atomic, write_text_atomic
from ..evaluation.sample import sample, score_records, summarize
from ..evaluation.system import load_system, rollout_spec
from ..algorithms import ALGOS
from ..tasks.graders import reward_function
from ..tasks.chat_messages import messages
from ..tasks.registry import load_task
from ..tasks.synthetic import completion_text, make_split, noisy_demonstration
from ..models.tiny import bpe_tokenizer, tiny_causal_lm
from ..training.callbacks import JsonlLogger, ProgressBar
from ..training.trainer import TarpoTrainer
from .launch_variables import LORA_TARGET_PRESETS
from .presets import DATASETS

MODEL = dict(hidden_size=128, layers=4, heads=4, kv_heads=2, intermediate_size=384)
TASK = DATASETS["arith"]  # group size, completions per step, prompt and completion lengths
# the RL runs' settings that are not flags (LoRA on every linear layer, Qwen2.5-3B's b0); the rest are flags
RL_SETTINGS = dict(action_bias=[2.2, 0.0], lora_r=16, lora_alpha=32,
                   lora_target_modules=LORA_TARGET_PRESETS["all-linear"])


def _log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- warm start
def warm_start(cache_dir: str, sft_steps: int, seed: int, noise: float, lr: float = 3e-3, batch_size: int = 32) -> str:
    """Folder of the warm-started model + tokenizer; reused when its settings match."""
    probe = noisy_demonstration(make_split("train", 1)[0], random.Random(0), 0.5)
    system = messages("arith", "")[0]["content"]
    key = hashlib.sha256(
        json.dumps([MODEL, sft_steps, seed, noise, lr, batch_size, probe, system]).encode()).hexdigest()[:12]
    folder = os.path.join(cache_dir, f"warm-{key}")
    if os.path.exists(os.path.join(folder, "DONE")):
        _log(f"reusing the warm-started model in {folder}")
        return folder
    train = make_split("train")
    tokenizer, model = demo_tokenizer_and_model(train, seed)
    supervised_warm_start(model, tokenizer, train, sft_steps, lr, batch_size, seed, noise)
    tmp = folder + ".tmp"
    model.eval().save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    open(os.path.join(tmp, "DONE"), "w").close()
    if not os.path.exists(folder):  # a concurrent run may have finished first; keep its copy
        publish_folder(tmp, folder)
    _log(f"warm-started model saved to {folder}")
    return folder


def demo_tokenizer_and_model(train: list[dict], seed: int):
    """The tokenizer trained on the system prompt and the train split, and the random model
    (``MODEL``, in training mode) that the warm start teaches."""
    system = messages("arith", "")[0]["content"]
    corpus = [system] * 20 + [f"{p['question']} {completion_text(p)}" for p in train] + [
        "<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n"]
    tokenizer = bpe_tokenizer(corpus, vocab_size=400)
    model = tiny_causal_lm(tokenizer, "qwen2", seed=seed, **{k: MODEL[k] for k in (
        "hidden_size", "layers", "heads", "kv_heads", "intermediate_size")}).train()
    return tokenizer, model


def prompt_ids(tokenizer, records: list[dict]) -> list[list[int]]:
    """Each problem's prompt (the chat template's system and user turns, then the assistant's header)."""
    return [tokenizer(tokenizer.apply_chat_template(messages("arith", p["question"]), tokenize=False,
                                                    add_generation_prompt=True),
                      add_special_tokens=False)["input_ids"] for p in records]


def demonstration_batch(tokenizer, prompts: list[list[int]], records: list[dict], picks: list[int],
                        rng: random.Random, noise: float):
    """``ids, mask, labels`` of the rows ``prompts[i] + noisy demonstration of records[i] + EOS``
    for ``i`` in ``picks``, right-padded; labels -100 except on the demonstration and its EOS."""
    targets = tokenizer([noisy_demonstration(records[i], rng, noise) for i in picks],
                        add_special_tokens=False)["input_ids"]
    batch = [(prompts[i], t + [tokenizer.eos_token_id]) for i, t in zip(picks, targets)]
    width = max(len(p) + len(c) for p, c in batch)
    ids = torch.full((len(batch), width), tokenizer.pad_token_id)
    labels = torch.full((len(batch), width), -100)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (p, c) in enumerate(batch):
        seq = p + c
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, len(p):len(seq)] = torch.tensor(c)
        mask[i, :len(seq)] = 1
    return ids, mask, labels


def supervised_warm_start(model, tokenizer, records, steps: int, lr: float, batch_size: int, seed: int,
                          noise: float) -> None:
    """Cross-entropy on the assistant turn (worked solution + tag + answer + EOS) only.

    The demonstrations are noisy (:func:`noisy_demonstration`: each step off by one with
    probability ``noise``, fresh noise every time a problem is drawn), so the model learns
    to sample correct and careless steps and RL has a real signal to sharpen. The prompts'
    common beginning (the system turn) is run once per step (:func:`shared_prefix_loss`).
    """
    rng = random.Random(seed)
    prompts = prompt_ids(tokenizer, records)
    shared = common_prefix(prompts)
    prefix, prompts = torch.tensor(shared), [p[len(shared):] for p in prompts]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    for _ in tqdm(range(steps), desc="warm start (SFT)", mininterval=5):
        picks = rng.sample(range(len(records)), batch_size)
        ids, mask, labels = demonstration_batch(tokenizer, prompts, records, picks, rng, noise)
        loss = shared_prefix_loss(model, prefix, ids, mask, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()


def common_prefix(rows: list[list[int]]) -> list[int]:
    """The longest beginning that every row shares, one token short of the shortest row (so
    that every row keeps a token of its own).

    >>> common_prefix([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3]])
    [1, 2]
    """
    first, n = rows[0], min(len(r) for r in rows) - 1
    for r in rows[1:]:
        n = next((i for i in range(n) if r[i] != first[i]), n)
    return first[:n]


def shared_prefix_loss(model, prefix: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
                       labels: torch.Tensor) -> torch.Tensor:
    """The causal-LM loss of the rows ``prefix + ids[i]`` (right-padded: ``mask``; ``labels``
    -100 where not learned), with the prefix's forward and backward run for one row, not all.

    The prefix's keys and values are computed once and repeated over the batch; the rows
    continue from them at positions ``len(prefix)...``, and the gradient through the repeated
    cache sums over the rows. It equals ``model(cat(prefix, ids), labels=cat(-100, labels)).loss``
    to rounding (tests/test_demo.py); the demo's system turn is 39 of a row's ~70 tokens, and a
    warm-start step takes 0.65x the time (benchmarks/bench_warm_start.py).
    """
    cache = model(input_ids=prefix[None], use_cache=True, logits_to_keep=1).past_key_values
    cache.batch_repeat_interleave(ids.shape[0])
    full_mask = torch.cat([mask.new_ones(ids.shape[0], prefix.numel()), mask], dim=1)
    return model(input_ids=ids, attention_mask=full_mask, past_key_values=cache, labels=labels).loss


# ---------------------------------------------------------------- RL
def train_rl(algo: str, base: str, out_dir: str, args, reward=None) -> str:
    """Train ``algo`` ('grpo': routing hard; 'tarpo': learned routing) from the warm start,
    with the task's correctness reward unless ``reward`` is given."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    config = TarpoConfig(
        output_dir=out_dir, routing=ALGOS[algo].name, seed=args.seed, data_seed=args.seed,
        max_steps=args.steps, per_device_train_batch_size=args.batch, num_generations=args.group_size,
        learning_rate=args.lr, router_lr=args.router_lr, temperature=args.temperature, **copy.deepcopy(RL_SETTINGS),
        max_prompt_length=TASK["max_prompt_length"], max_completion_length=args.max_new_tokens, bf16=False,
        gradient_checkpointing=False, save_strategy="no", report_to="none",
        disable_tqdm=True, logging_steps=1, lr_scheduler_type=args.lr_schedule,
        rollout_engine=args.engine, is_correction=args.is_correction, gumbel_temperature=args.gumbel_temperature,
    )
    os.makedirs(out_dir, exist_ok=True)
    write_text_atomic(os.path.join(out_dir, "config.json"), config.to_json_string())
    log_path = os.path.join(out_dir, "metrics.jsonl")
    open(log_path, "w").close()
    train = load_task("arith", split="train")
    trainer = TarpoTrainer(model=model, reward_funcs=reward or reward_function("arith"), args=config,
                           train_dataset=train, processing_class=tokenizer,
                           callbacks=[JsonlLogger(log_path), ProgressBar(algo, args.steps)])
    trainer.remove_callback(PrinterCallback)  # the progress bar and metrics.jsonl report instead
    trainer.train()
    adapter = os.path.join(out_dir, "adapter")
    trainer.save_model(adapter)
    return adapter


# ---------------------------------------------------------------- evaluation and report
def evaluate_system(name: str, base: str, adapter: str | None, args) -> dict:
    mode = ALGOS[name].eval_mode if name in ALGOS else "cot"
    system = load_system(base, adapter, mode, dtype="float32", device="cpu")
    examples = list(load_task("arith", split="test"))[: args.eval_questions]
    spec = rollout_spec({"max_new_tokens": args.max_new_tokens, "temperature": args.temperature})
    torch.manual_seed(args.seed)
    per_call = max(1, 128 // args.eval_n)  # questions a batch of at most 128 samples holds (the batches of one call)
    records = []
    with tqdm(total=len(examples) * args.eval_n, desc=f"eval {name}", mininterval=5) as bar:
        for start in range(0, len(examples), per_call):
            chunk = examples[start:start + per_call]
            records += sample(system, chunk, args.eval_n, spec, max_prompt_length=TASK["max_prompt_length"],
                              batch_size=128)
            bar.update(len(chunk) * args.eval_n)
    records = score_records(records, examples)
    write_jsonl_atomic(os.path.join(args.out, f"eval_{name}.jsonl"), records)
    metrics = summarize(records, (1, args.eval_n))
    return {"pass@1": metrics["pass@1"], "pass@k": metrics[f"pass@{args.eval_n}"], "k": args.eval_n, **metrics}


def render_table(summary: dict, k: int) -> str:
    lines = [f"| system | pass@1 | pass@{k} | soft ratio | units | hard tokens |", "|---|---|---|---|---|---|"]
    for name, m in summary.items():
        lines.append(f"| {name} | {m['pass@1']:.3f} | {m['pass@k']:.3f} | {m['soft_ratio']:.3f} | "
                     f"{m['units']:.1f} | {m['hard_tokens']:.1f} |")
    return "\n".join(lines)


def parse_args(argv=None):
    class Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass  # the module docstring as written, and every flag's default (run_demo.sh restates none)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=Help)
    ap.add_argument("--out", default=None, help="run folder (default runs/demo-<time>-seed<seed>)")
    ap.add_argument("--cache-dir", default=os.path.join("runs", "cache"), help="where the warm start is kept")
    ap.add_argument("--seed", type=int, default=0, help="seed of RL and evaluation")
    ap.add_argument("--warm-seed", type=int, default=0, help="seed of the warm start (shared across --seed runs)")
    ap.add_argument("--sft-steps", type=int, default=1500, help="supervised warm-start steps")
    ap.add_argument("--sft-batch", type=int, default=32, help="demonstrations per warm-start step")
    ap.add_argument("--sft-noise", type=float, default=0.4, help="chance a demonstrated step is off by one")
    ap.add_argument("--steps", type=int, default=100, help="RL steps per algorithm")
    ap.add_argument("--group-size", type=int, default=TASK["num_generations"])
    ap.add_argument("--batch", type=int, default=TASK["per_device_train_batch_size"], help="completions per RL step")
    ap.add_argument("--lr", type=float, default=1e-3, help="LoRA learning rate")
    ap.add_argument("--router-lr", type=float, default=5e-3)
    ap.add_argument("--lr-schedule", default="constant_with_warmup",
                    help="LR schedule after 10%% warm-up (paper: cosine; the short demo keeps the LR constant)")
    ap.add_argument("--max-new-tokens", type=int, default=TASK["max_completion_length"])
    ap.add_argument("--temperature", type=float, default=default("temperature"),
                    help="sampling temperature for training and evaluation (default: TarpoConfig's, the paper's)")
    ap.add_argument("--eval-questions", type=int, default=300)
    ap.add_argument("--eval-n", type=int, default=8, help="samples per test question (k of pass@k)")
    ap.add_argument("--algos", default="grpo,tarpo", help="RL systems to train and evaluate besides CoT")
    ap.add_argument("--engine", default="auto", choices=ENGINES,
                    help="rollout engine of the RL runs (docs/rollout-engines.md); auto: the one whose cost the "
                         "run repays, decided after the first rollout (tarpo/engine/engine_choice.py)")
    add_flags(ap, ["is_correction", "gumbel_temperature"])  # docs/algorithm.md §8 (benchmarks/demo_variants.py)
    ap.add_argument("--workers", type=int, default=0,
                    help="processes that train and evaluate the systems side by side (0: one per core, at most "
                         "one per system); the cores are shared among them")
    return ap.parse_args(argv)


def run_system(name: str, base: str, args) -> dict:
    """Evaluate one system: ``cot`` (the warm start), or an RL algorithm trained first."""
    torch.set_num_threads(args.threads)
    adapter = None if name == "cot" else train_rl(name, base, os.path.join(args.out, name), args)
    return evaluate_system(name, base, adapter, args)


def main(argv=None) -> str:
    args = parse_args(argv)
    cores = os.cpu_count() or 1
    algos = [a for a in args.algos.split(",") if a]
    trainable = [a for a, rule in ALGOS.items() if not rule.soft.trained]
    for a in algos:
        if a not in trainable:
            raise ValueError(f"--algos {a!r}: the demo trains {', '.join(trainable)}")
    workers = max(1, min(args.workers or cores, cores, len(algos) + 1))
    args.threads = max(1, cores // workers)
    args.out = args.out or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S") + f"-seed{args.seed}")
    os.makedirs(args.out, exist_ok=True)
    write_json_atomic(os.path.join(args.out, "config.json"), vars(args))
    started = time.time()
    torch.set_num_threads(cores)
    base = warm_start(args.cache_dir, args.sft_steps, args.warm_seed, args.sft_noise, batch_size=args.sft_batch)
    names = [*algos, "cot"]  # the long runs first; CoT's evaluation goes to the first free worker
    if workers == 1:
        results = {name: run_system(name, base, args) for name in names}
    else:  # each system in its own process: on a few cores a tiny model's step is bound by Python, not FLOPs
        _log(f"training and evaluating {', '.join(names)} in {workers} processes of {args.threads} thread(s)")
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {name: pool.submit(run_system, name, base, args) for name in names}
            results = {name: future.result() for name, future in futures.items()}
    summary = {name: results[name] for name in ["cot", *algos]}
    if algos:  # the training curves of the RL runs, as `tarpo plot` draws them
        plot_runs([os.path.join(args.out, a) for a in algos], algos, os.path.join(args.out, "curves.png"))
    table = render_table(summary, args.eval_n)
    write_text_atomic(os.path.join(args.out, "table.md"), table + "\n")
    path = os.path.join(args.out, "summary.json")
    write_json_atomic(path, summary)
    print(table)
    _log(f"done in {time.time() - started:.0f} s")
    print(os.path.abspath(path))
    return path


if __name__ == "__main__":
    from ..process_exit import skip_the_final_collection
    skip_the_final_collection()
    main()
