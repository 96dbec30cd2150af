"""Lockstep decoding on several processes (``accelerate launch``), for tests/test_ddp.py.

Rank r decodes the same prompts with an EOS bias of its own (rank 0: EOS very likely, its rows
end after a few steps; rank 1: none, its rows run to the length limit). With ``lockstep`` every
rank must make the same number of decode steps; each rank also decodes alone (no lockstep) and
saves both rollouts and both step counts to ``<out>/rank<r>-<engine>.pt``.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from accelerate import PartialState  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/ (helpers)
from helpers import BiasedBackbone, policy_of, encode_prompts  # noqa: E402

from tarpo.engine import static_decode  # noqa: E402
from tarpo.engine.rollout import RolloutSpec, hybrid_generate  # noqa: E402
from tarpo.engine.router import Router  # noqa: E402
from tarpo.models.tiny import char_tokenizer, tiny_causal_lm  # noqa: E402


def any_rank(flag: bool) -> bool:
    """True when ``flag`` is True on some rank (all ranks call it together): the ``lockstep`` of the rollout
    engines, one small all-reduce per check, "does any rank still have a running row"."""
    value = torch.tensor([int(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class StepCounter:
    """Counts decode steps: decoder calls of the eager engine (a forward hook), calls of the compiled
    engine's step function (a wrapper: inside the graph a hook would not run)."""

    def __init__(self, model):
        self.n = 0
        self.hook = model.get_decoder().register_forward_hook(lambda *a: self.add())
        original = static_decode.compiled_step

        def counted(device):
            step = original(device)

            def run(*args):
                self.add()
                return step(*args)
            return run
        static_decode.compiled_step = counted

    def add(self):
        self.n += 1


def main(out):
    state = PartialState(cpu=True)
    rank = state.process_index
    torch.set_num_threads(1)
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, "qwen2", seed=0).eval()
    bias = torch.zeros(model.config.vocab_size)
    bias[tok.eos_token_id] = 6.0 if rank == 0 else -1e4
    backbone = BiasedBackbone(model, bias)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0])
    enc = encode_prompts(tok, ["what is 2+3?", "hi", "a longer prompt"])
    counter = StepCounter(model)
    for engine in ("eager", "compiled"):
        if engine == "compiled":
            counter.hook.remove()  # dynamo would trace it into the graph; the step wrapper counts
        spec = RolloutSpec(max_new_tokens=70, temperature=0.8, soft_top_k=5, engine=engine)
        result = {}
        for mode, lockstep in (("lockstep", any_rank), ("alone", None)):
            counter.n = 0
            r = hybrid_generate(policy_of(backbone, tok, router), enc.input_ids, enc.attention_mask, spec,
                                noise_seed=7, lockstep=lockstep)
            result[mode] = {"rollout": r.__dict__, "steps": counter.n}
        torch.save(result, os.path.join(out, f"rank{rank}-{engine}.pt"))
    state.wait_for_everyone()
    return 0


if __name__ == "__main__":
    from tarpo.process_exit import skip_the_final_collection
    skip_the_final_collection()  # as the project's commands: no last collection over the imports
    sys.exit(main(sys.argv[1]))
