"""Nothing grows from one training step to the next (transformers backend; the Unsloth backend's run is
tests/test_unsloth_trainer.py): the forward and backward hooks on every module, the registered buffers and
tensors kept on modules, the graphs dynamo compiled and the process's live tensors are the same after
step 2 and after step 6 of a ``TarpoTrainer`` run with gradient checkpointing (the launchers' default), and
the rollouts leave every module's checkpointing flag and function as the Trainer set them up."""

import pytest

from growth import GrowthProbe, differences
from helpers import letter_reward, make_args, make_dataset
from tarpo.models.tiny import tiny_causal_lm
from tarpo.training.trainer import TarpoTrainer


@pytest.mark.parametrize("engine, routing", [("eager", "learned"), ("eager", "hrpo"), ("compiled", "learned")])
def test_nothing_grows_from_step_2_to_step_6(tokenizer, tmp_path, engine, routing):
    probe = GrowthProbe([2, 6])
    args = make_args(tmp_path, max_steps=6, gradient_checkpointing=True, routing=routing, rollout_engine=engine)
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, "qwen2"), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(24), processing_class=tokenizer, callbacks=[probe])
    trainer.train()
    assert sorted(probe.taken) == [0, 2, 6]
    first = probe.taken[2]
    assert first["checkpointing"] == probe.taken[0]["checkpointing"]  # as the Trainer set it up, after rollouts
    assert first["hooks"] and first["tensors"]["count"] > 0
    if engine == "compiled":  # the run's compiled step, one per device and backend (an earlier test of this worker
        # may have made another backend's: count this one's)
        from tarpo.engine import static_decode
        assert ("cpu", static_decode.compile_backend()) in static_decode._COMPILED
    assert differences(first, probe.taken[6]) == {}
