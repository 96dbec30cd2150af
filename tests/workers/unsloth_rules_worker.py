"""Two rules of the GPU path checked on Unsloth's own code (tests/workers/unsloth_cpu.py), for
tests/test_unsloth_cpu.py: the compiled decode step's settings in a process that imported Unsloth, and the
left-padded training forward.

**The compiled step**: which dynamo and inductor settings are in force while the step compiles, what a compile
failure of the step does, and the compiled rollout of an Unsloth-loaded model under inductor.

Importing Unsloth sets dynamo's ``suppress_errors`` and inductor's ``memory_planning`` (among others) for the
whole process (unsloth_zoo/patching_utils.py, ``patch_torch_compile``). The step compiles under its own
(:data:`tarpo.engine.static_decode.STEP_SETTINGS`), so a failed compile raises instead of running the step
eagerly. Three compiled rollouts of the same seeded batch, each step lowered by: ``record`` (a backend that
records the settings and runs the traced graph as it is), ``fail`` (a backend that raises) and inductor.

**Left padding**: the training forward (training mode, as the trainer scores) of a left-padded batch gives
each row's per-token log-probs at its real positions as the row alone, unpadded, does: with tarpo.patches'
flag (``kept``), and with it cleared (``dropped``: Unsloth's training forward then drops the mask), which
shows the comparison sees a dropped mask.

    UNSLOTH_ALLOW_CPU=1 PYTHONPATH=<unsloth-cpu site>:tests python tests/workers/unsloth_rules_worker.py M A out.pt
"""

import os
import sys

import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(TESTS), TESTS]  # this checkout's tarpo; tests/ (checkout, helpers)

from checkout import use_checkout_patches  # noqa: E402


def settings() -> dict:
    import torch._inductor.config as inductor
    return {"suppress_errors": torch._dynamo.config.suppress_errors, "memory_planning": inductor.memory_planning}


def padding_gaps(model, backbone, ids, mask) -> dict:
    """The largest |log-prob difference| at real positions between the left-padded batch and each row alone,
    in training mode, with tarpo.patches' keep-the-mask flag set (``kept``) and cleared (``dropped``)."""
    from tarpo.engine.backbone import positions_from_mask, unwrap
    from tarpo.patches.training_forward import KEEP_MASK

    def logp(ids, mask):
        with torch.no_grad():
            hidden = backbone.hidden(backbone.embed_weight[ids], mask, positions_from_mask(mask))
            logits = backbone.logits(hidden).float()
        return logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]

    decoder = unwrap(model).get_decoder()
    model.train()
    gaps = {}
    for name, keep in (("kept", True), ("dropped", False)):
        setattr(decoder, KEEP_MASK, keep)
        batch = logp(ids, mask)
        gap = 0.0
        for row in range(ids.shape[0]):
            start = int((mask[row] == 0).sum())  # exact: an integer mask
            alone = logp(ids[row:row + 1, start:], mask[row:row + 1, start:])[0]
            gap = max(gap, (batch[row, start:] - alone).abs().max().item())
        gaps[name] = gap
    setattr(decoder, KEEP_MASK, True)
    model.eval()
    return gaps


def main(model_dir, adapter, out):
    use_checkout_patches()
    import tarpo.training.trainer  # noqa: F401  (TRL's own GRPOTrainer before Unsloth can replace it)
    import unsloth  # noqa: F401

    import unsloth_cpu
    from backend_worker import fixed_batch
    from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate
    from tarpo.engine.soft_input import TOP_K_MIXTURE
    from tarpo.engine.static_decode import COMPILE_BACKEND_VARIABLE
    from tarpo.engine.tagging import token_text_fn
    from tarpo.models.backends import make_backbone

    process = settings()  # what importing Unsloth left for the whole process
    seen = []

    @torch._dynamo.register_backend(name="tarpo_record")
    def record(graph, example_inputs):
        seen.append(settings())
        return graph.forward

    @torch._dynamo.register_backend(name="tarpo_fail")
    def fail(graph, example_inputs):
        raise RuntimeError("forced failure of the compile backend")

    model, router, tok = unsloth_cpu.load_trained(model_dir, adapter)
    model.eval()
    policy = Policy(make_backbone(model), token_text_fn(tok), [tok.eos_token_id], tok.pad_token_id, router,
                    TOP_K_MIXTURE)
    ids, mask = fixed_batch(model.config.vocab_size, "cpu")
    spec = RolloutSpec(max_new_tokens=12, temperature=0.5, routing="learned", engine="compiled")

    def rollout(backend):
        os.environ[COMPILE_BACKEND_VARIABLE] = backend
        return vars(hybrid_generate(policy, ids, mask, spec, noise_seed=0))

    recorded = rollout("tarpo_record")
    try:
        rollout("tarpo_fail")
        failure = None
    except Exception as e:  # noqa: BLE001  (what the caller of a rollout meets, whatever its type)
        failure = f"{type(e).__name__}: {e}"
    inductor = rollout("inductor")
    padded = bool((mask == 0).any())  # exact: an integer mask
    torch.save(dict(process=process, seen=seen, after=settings(), failure=failure, recorded=recorded,
                    inductor=inductor, padded=padded, padding=padding_gaps(model, policy.backbone, ids, mask)), out)
    return 0


if __name__ == "__main__":
    from tarpo.process_exit import skip_the_final_collection
    skip_the_final_collection()  # as the project's commands: no last collection over the imports
    sys.exit(main(*sys.argv[1:4]))
