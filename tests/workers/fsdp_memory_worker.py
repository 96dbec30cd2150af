"""One rank of an FSDP2 run on the CPU (gloo) whose tensor memory is measured, for tests/test_memory_plan.py.

Started once per rank by the test (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set, as
``accelerate launch`` sets them). The model is sharded by accelerate's own ``fsdp2_prepare_model`` (the
TRANSFORMER_BASED_WRAP of configs/fsdp2.yaml), and the rollout and the training step run as
:class:`tarpo.training.trainer.TarpoTrainer` runs them (:mod:`tarpo.training.sharding`): a first step
(rollout, forward/backward, AdamW step) fills the optimizer state, then the second step's rollout and
forward/backward are measured with :class:`live_storage.HeldStorage`: every tensor byte the rank holds,
weights, shards, gathered parameters and optimizer state included. Writes ``<out>/rank<r>.json``.

    python tests/workers/fsdp_memory_worker.py OUT '{"d": 256, ...}'
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["ACCELERATE_USE_CPU"] = "true"

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import FullyShardedDataParallelPlugin  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

import fsdp_cpu  # noqa: E402
from live_storage import HeldStorage  # noqa: E402
from tarpo.engine.backbone import Backbone  # noqa: E402
from tarpo.engine.precision import mixed_precision  # noqa: E402
from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate  # noqa: E402
from tarpo.engine.soft_input import TOP_K_MIXTURE  # noqa: E402
from tarpo.engine.router import Router  # noqa: E402
from tarpo.models.tiny import char_tokenizer, synthetic_rollout, tiny_causal_lm  # noqa: E402
from tarpo.training import sharding  # noqa: E402
from tarpo.training.distributed import forward_through  # noqa: E402
from tarpo.training.grad_checkpointing import checkpointing_paused  # noqa: E402
from tarpo.training.scoring import ScoreSettings, score_rollout  # noqa: E402

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def rollout(model, router, c):
    ids = torch.randint(10, c["vocab"], (c["rows"], c["prompt"]), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    spec = RolloutSpec(max_new_tokens=c["completion"], engine="eager", answer_tag="@@@@", soft_top_k=c["k"])
    with sharding.gathered(model), checkpointing_paused(model):  # as TarpoTrainer._generate
        backbone = Backbone(model)
        with mixed_precision(backbone):
            policy = Policy(backbone, lambda i: "x", [], 0, router, TOP_K_MIXTURE)
            return hybrid_generate(policy, ids, mask, spec, noise_seed=1)


def train_step(wrapped, model, router, c):
    """A micro-batch's forward (policy + reference) and backward, as TarpoTrainer._compute_loss runs it."""
    scored = synthetic_rollout(c["vocab"], c["rows"], c["prompt"], c["completion"], c["k"], "cpu")
    scored.is_soft = scored.decided.clone()  # every thinking step soft, as the one-process measurement

    def forward():
        sharding.gather_direct_reads(model)
        backbone = Backbone(model)
        with mixed_precision(backbone):
            s = score_rollout(backbone, router, router.frozen_copy(), scored,
                              ScoreSettings(temperature=0.5, chunk_size=1024, use_router=True, with_reference=True),
                              TOP_K_MIXTURE)
        return {"loss": s.logp_tok.sum() + s.logp_act.sum() + s.kl_tok.sum() + s.kl_act.sum()}

    forward_through(wrapped, model, forward)["loss"].backward()


def main(out, c):
    fsdp_cpu.install()
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            reshard_after_forward=True, cpu_ram_efficient_loading=False,
                                            state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = tiny_causal_lm(char_tokenizer(), "qwen2", hidden_size=c["d"], layers=c["layers"], heads=c["heads"],
                           kv_heads=c["kv"], intermediate_size=c["inter"], vocab_size=c["vocab"]).to(torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=c["r"], lora_alpha=16, target_modules=ATTENTION))
    model.train()
    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.base_model.model.tarpo_router = Router(c["d"], bias=[4.6, 0.0], init_std=1e-3)
    sharding.check_sharding(accelerator)
    sharding.prepare(accelerator, [p for p in model.parameters() if p.requires_grad])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    wrapped, optimizer = accelerator.prepare(model, optimizer)  # FSDP2: accelerate swaps in the sharded parameters
    model = accelerator.unwrap_model(wrapped)
    router = model.base_model.model.tarpo_router

    rollout(model, router, c)  # the first step: fills the optimizer state, makes FSDP's all-gather buffers
    train_step(wrapped, model, router, c)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    held = HeldStorage()
    with held:
        done = rollout(model, router, c)
    rollout_peak = held.peak
    del done
    held = HeldStorage()
    with held:
        train_step(wrapped, model, router, c)
    rank = torch.distributed.get_rank()
    assert len(sharding.units(model)) >= c["layers"] + 1, sharding.units(model)  # sharded per layer, and the root
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rollout": rollout_peak, "train": held.peak}, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    from tarpo.process_exit import skip_the_final_collection
    skip_the_final_collection()  # as the project's commands: no last collection over the imports
    main(sys.argv[1], json.loads(sys.argv[2]))
