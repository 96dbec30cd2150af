"""Unsloth's decode path on the CPU (tests/workers/unsloth_cpu.py) with and without tarpo.patches.grouped_decode,
for tests/test_unsloth_cpu.py: a seeded rollout of a left-padded batch, the SDPA calls of its decode
steps, its host syncs per step (tests/syncs.py), and what of the rollout's K/V is alive after it.

    UNSLOTH_ALLOW_CPU=1 PYTHONPATH=<unsloth-cpu site>:tests \\
        python tests/workers/unsloth_decode_worker.py M A out.pt [--repeated]

``--repeated``: Unsloth's own decode attention (K/V expanded per query head by SDPA's math kernel
when a padding mask is given), the reference.
"""

import os
import sys
import weakref

import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(TESTS), TESTS]  # this checkout's tarpo; tests/ (checkout, helpers)

from checkout import use_checkout_patches  # noqa: E402


def main(model_dir, adapter, out, repeated):
    use_checkout_patches()
    import tarpo.training.trainer  # noqa: F401  (TRL's own GRPOTrainer before Unsloth can replace it)
    import unsloth  # noqa: F401
    import unsloth.models.llama as unsloth_llama

    import unsloth_cpu
    from backend_worker import fixed_batch
    from syncs import per_decode_step
    from tarpo.models.backends import UNSLOTH_DECODE_BUFFERS, UnslothBackbone, make_backbone
    from tarpo.patches import grouped_decode
    from tarpo.engine.rollout import Policy, RolloutSpec, hybrid_generate
    from tarpo.engine.soft_input import TOP_K_MIXTURE
    from tarpo.engine.tagging import token_text_fn

    if repeated:
        grouped_decode.decode_function = lambda: unsloth_llama.LlamaModel_fast_forward_inference
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(query, key, value, attn_mask=None, *args, enable_gqa=False, **kwargs):
        calls.append(dict(query=tuple(query.shape), key=tuple(key.shape), mask=attn_mask is not None,
                          gqa=bool(enable_gqa and key.shape[1] < query.shape[1])))
        return sdpa(query, key, value, attn_mask, *args, enable_gqa=enable_gqa, **kwargs)
    torch.nn.functional.scaled_dot_product_attention = recording_sdpa
    unsloth_llama.scaled_dot_product_attention = recording_sdpa  # the name Unsloth's decode attention calls

    model, router, tok = unsloth_cpu.load_trained(model_dir, adapter)
    model.eval()
    backbone = make_backbone(model)
    assert isinstance(backbone, UnslothBackbone)
    refs = []
    hidden = UnslothBackbone.hidden

    def recording_hidden(self, *args, **kwargs):  # weak references to what the cache holds after each step
        h = hidden(self, *args, **kwargs)
        for module in model.modules():
            refs.extend(weakref.ref(module.__dict__[n]) for n in UNSLOTH_DECODE_BUFFERS if n in module.__dict__)
        refs.extend(weakref.ref(t) for layer in (self._past or []) for t in layer if torch.is_tensor(t))
        return h
    UnslothBackbone.hidden = recording_hidden

    ids, mask = fixed_batch(model.config.vocab_size, "cpu")
    spec = RolloutSpec(max_new_tokens=20, temperature=0.5, routing="learned", engine="eager")
    policy = Policy(backbone, token_text_fn(tok), [tok.eos_token_id], tok.pad_token_id, router, TOP_K_MIXTURE)
    per_step, r, syncs = per_decode_step(lambda: hybrid_generate(policy, ids, mask, spec, noise_seed=0))
    left = [type(m).__name__ for m in model.modules() if set(UNSLOTH_DECODE_BUFFERS) & set(vars(m))]
    torch.save(dict(rollout={k: v for k, v in vars(r).items()}, calls=calls, refs=len(refs),
                    alive=sum(ref() is not None for ref in refs), modules_with_buffers=left,
                    past=backbone._past is not None, groups=model.config.num_attention_heads
                    // model.config.num_key_value_heads, syncs_per_step=per_step, sync_sites=dict(syncs.where)), out)
    return 0


if __name__ == "__main__":
    from tarpo.process_exit import skip_the_final_collection
    skip_the_final_collection()  # as the project's commands: no last collection over the imports
    sys.exit(main(*sys.argv[1:4], repeated="--repeated" in sys.argv[4:]))
