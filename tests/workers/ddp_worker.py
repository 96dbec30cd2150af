"""A few TarpoTrainer steps on a tiny model, one process or several (``accelerate launch``), for
tests/test_ddp.py. After every optimizer step each rank saves its trainable tensors (LoRA and
router) to ``<out>/rank<r>-step<s>.pt`` (step 0: before training), and at the start its frozen
reference router to ``<out>/ref-router-rank<r>.pt``.

    python tests/workers/ddp_worker.py d1 --grad-accum 2                      # one process
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 tests/workers/ddp_worker.py d2

Under FSDP2 (tests/test_fsdp.py: ``accelerate launch --use_fsdp --fsdp_version 2`` with
tests/workers/fsdp_site on PYTHONPATH) the saved tensors are gathered whole. ``--cases routing:reward,...``
trains each case in turn into ``<out>/<routing>-<reward>/`` (``reward`` vowels: the share of vowels; zero:
every reward 0, so every advantage 0).

A case ``routing:reward:nanrank0`` makes rank 0's first training loss NaN, its gradients finite
(:func:`nan_loss_on_rank0`).

``--direct-forward`` (or a case ``routing:reward:direct``, into ``<out>/<routing>-<reward>-direct/``) restores a
defect (docs/several-gpus.md): the training forward calls the decoder directly instead of through the module
accelerate wrapped, so DDP never all-reduces a gradient.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from tarpo.training import trainer as trainer_module  # noqa: E402
from tarpo.config import TarpoConfig  # noqa: E402
from tarpo.models.tiny import char_tokenizer, tiny_causal_lm  # noqa: E402
from tarpo.training.trainer import TarpoTrainer  # noqa: E402


def letter_reward(prompts, completions, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]


def zero_reward(prompts, completions, **kwargs):
    return [0.0] * len(completions)


REWARDS = {"vowels": letter_reward, "zero": zero_reward}


def whole(tensor):
    """A parameter's full value (FSDP2 shards are gathered: every rank calls this together)."""
    from torch.distributed.tensor import DTensor
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


class SaveTrainable(TrainerCallback):
    def __init__(self, trainer, out):
        self.trainer, self.out = trainer, out

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if os.environ.get("TARPO_SAVE_GRADS"):
            model = self.trainer.accelerator.unwrap_model(self.trainer.model)
            grads = {n: whole(p.grad) for n, p in model.named_parameters() if p.grad is not None}
            rank = self.trainer.accelerator.process_index
            torch.save(grads, os.path.join(self.out, f"grad-rank{rank}-step{state.global_step + 1}.pt"))

    def on_train_begin(self, args, state, control, **kwargs):
        self.on_step_end(args, state, control)  # step 0: the parameters training starts from
        rank = self.trainer.accelerator.process_index
        from torch.distributed.tensor import DTensor

        from tarpo.training.sharding import units
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        params = list(model.parameters())
        held = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)
        with open(os.path.join(self.out, f"shards-rank{rank}.json"), "w") as f:  # what this rank holds
            json.dump({"units": len(units(model)), "held": held, "total": sum(p.numel() for p in params)}, f)
        ref = self.trainer.ref_router  # None under a routing without a router (GRPO)
        torch.save({n: t.detach().clone() for n, t in (ref.state_dict() if ref is not None else {}).items()},
                   os.path.join(self.out, f"ref-router-rank{rank}.pt"))

    def on_step_end(self, args, state, control, **kwargs):
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        tensors = {n: whole(p) for n, p in model.named_parameters() if p.requires_grad}
        rank = self.trainer.accelerator.process_index
        torch.save(tensors, os.path.join(self.out, f"rank{rank}-step{state.global_step}.pt"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--routing", default="learned")
    ap.add_argument("--cases", default=None, help="routing:reward,... each into <out>/<routing>-<reward>")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--per-device", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--direct-forward", action="store_true")
    ap.add_argument("--optim", default="sgd")
    ap.add_argument("--max-grad-norm", type=float, default=0.1)
    ap.add_argument("--no-shuffle", action="store_true",
                    help="keep TRL from shuffling a generation batch before cutting it into micro-batches")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.no_shuffle:
        import trl.trainer.grpo_trainer as grpo
        grpo.shuffle_sequence_dict = lambda batch: batch
    cases = ([c.split(":") for c in args.cases.split(",")] if args.cases
             else [[args.routing, "vowels", *(["direct"] if args.direct_forward else [])]])
    through, loss = trainer_module.forward_through, trainer_module.rollout_loss
    for routing, reward, *flags in cases:
        out = os.path.join(args.out, "-".join([routing, reward, *flags])) if args.cases else args.out
        trainer_module.forward_through = (lambda wrapped, inner, fn: fn()) if "direct" in flags else through
        trainer_module.rollout_loss = nan_loss_on_rank0(loss) if "nanrank0" in flags else loss
        train(args, routing, REWARDS[reward], out)
    # leave together: a rank that exits while the other still talks to it aborts ("terminate called without an
    # active exception"), which a loaded machine (pytest-xdist's other worker) makes likely
    if torch.distributed.is_initialized():  # several processes (one runs without a process group)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
        # and skip the interpreter's teardown: under load (pytest-xdist's other worker) a rank aborted in it
        # once in about 10 runs ("terminate called without an active exception", SIGABRT) after every file
        # was written; the files are closed, so nothing is lost
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def nan_loss_on_rank0(rollout_loss):
    """Case flag ``nanrank0``: rank 0's first training loss is NaN with finite gradients (a non-finite term without
    a gradient path), which DDP's all-reduce does not spread: the ranks must still take one decision."""
    calls = [0]

    def loss(*args, **kwargs):
        value, terms = rollout_loss(*args, **kwargs)
        calls[0] += 1
        if calls[0] == 1 and int(os.environ.get("RANK", "0")) == 0:
            value = value + float("nan")
        return value, terms
    return loss


def train(args, routing, reward, out):
    os.makedirs(out, exist_ok=True)
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, "qwen2", seed=0)
    data = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"question {i}?"}]} for i in range(16)])
    config = TarpoConfig(output_dir=os.path.join(out, "run"), bf16=False, use_cpu=True,
                         per_device_train_batch_size=args.per_device, gradient_accumulation_steps=args.grad_accum,
                         num_generations=4, max_completion_length=12, max_steps=args.steps, logging_steps=1,
                         report_to="none", gradient_checkpointing=False, save_strategy="no", learning_rate=1e-2,
                         router_lr=1e-1, action_bias=[0.5, 0.0], lora_r=4, lora_alpha=8, beta=0.05, seed=0,
                         data_seed=0, warmup_steps=0, optim=args.optim, max_grad_norm=args.max_grad_norm,
                         routing=routing, rollout_engine=args.engine)
    trainer = TarpoTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                           processing_class=tok)
    trainer.add_callback(SaveTrainable(trainer, out))
    trainer.train()


if __name__ == "__main__":
    from tarpo.process_exit import skip_the_final_collection
    skip_the_final_collection()  # as the project's commands: no last collection over the imports
    sys.exit(main())
