import pytest
import torch

from helpers import BiasedBackbone, ScriptedBackbone, policy_of, encode_prompts
from tarpo.engine.backbone import Backbone
from tarpo.engine.rollout import RolloutSpec, hybrid_generate
from tarpo.engine.router import Router
from tarpo.engine.soft_input import TOP_K_MIXTURE
from tarpo.training.scoring import ScoreSettings, score_rollout, sequence_hidden

PROMPTS = ["what is 2+3?", "hi", "a longer prompt here"]


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (20, 0.9)])
def test_hard_routing_reproduces_generate(model, tokenizer, top_k, top_p):
    enc = encode_prompts(tokenizer, PROMPTS)
    spec = RolloutSpec(max_new_tokens=48, temperature=0.7, top_k=top_k, top_p=top_p, routing="hard",
                       compact_finished_rows=False)
    torch.manual_seed(3)
    ours = hybrid_generate(policy_of(Backbone(model), tokenizer), enc.input_ids, enc.attention_mask, spec)
    torch.manual_seed(3)
    ref = model.generate(**enc, do_sample=True, temperature=0.7, top_k=top_k, top_p=top_p, max_new_tokens=48,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    ref = ref[:, enc.input_ids.shape[1]:]
    T = ours.token_ids.shape[1]
    assert torch.equal(ours.token_ids, ref[:, :T])  # exact: integer ids
    assert (ref[:, T:] == tokenizer.pad_token_id).all()  # exact: integer ids
    assert not ours.is_soft.any()


def _mixed_rollout(model, tokenizer, compact, eos_bias=0.0):
    torch.manual_seed(0)
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = eos_bias
    backbone = BiasedBackbone(model, bias)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0])  # ~50% soft
    enc = encode_prompts(tokenizer, PROMPTS)
    spec = RolloutSpec(max_new_tokens=40, temperature=0.8, soft_top_k=5, routing="learned",
                       answer_tag="####", compact_finished_rows=compact)
    out = hybrid_generate(policy_of(backbone, tokenizer, router), enc.input_ids, enc.attention_mask, spec)
    return backbone, router, out


def test_cached_decode_equals_full_forward_with_padding_and_mixed_rows(model, tokenizer):
    backbone, router, out = _mixed_rollout(model, tokenizer, compact=False)
    assert out.is_soft.any() and (out.completion_mask & ~out.is_soft).any()
    assert (out.prompt_mask == 0).any()  # left padding present
    # Logits seen step by step by the cached loop vs one forward over the rebuilt inputs.
    seen = []
    orig = backbone.logits
    backbone.logits = lambda h: seen.append(orig(h)) or seen[-1]
    torch.manual_seed(0)
    Router(model.config.hidden_size, bias=[0.0, 0.0])
    enc = encode_prompts(tokenizer, PROMPTS)
    spec = RolloutSpec(max_new_tokens=40, temperature=0.8, soft_top_k=5, compact_finished_rows=False)
    again = hybrid_generate(policy_of(backbone, tokenizer, router), enc.input_ids, enc.attention_mask, spec)
    backbone.logits = orig
    assert torch.equal(again.token_ids, out.token_ids)  # exact: integer ids
    with torch.no_grad():
        full = backbone.logits(sequence_hidden(backbone, out, TOP_K_MIXTURE))
    for t, step_logits in enumerate(seen):
        rows = out.completion_mask[:, t]
        torch.testing.assert_close(step_logits[rows], full[rows, t], atol=1e-4, rtol=0)


def test_compacted_rollout_scores_match_full_forward(model, tokenizer):
    backbone, router, out = _mixed_rollout(model, tokenizer, compact=True, eos_bias=4.0)
    units = out.units
    assert units.min() < units.max(), "rows should finish at different steps"
    assert out.ended_with_eos.any()
    assert_training_forward_replays(backbone, router, out)


def assert_training_forward_replays(backbone, router, out):
    """The training forward's log-probs of the rollout's tokens and its router probabilities equal the rollout's."""
    with torch.no_grad():
        scores = score_rollout(backbone, router, None, out,
                               ScoreSettings(temperature=0.8, chunk_size=7, use_router=True, with_reference=False),
                               TOP_K_MIXTURE)
    m = out.completion_mask
    torch.testing.assert_close(scores.logp_tok[m], out.logp[m], atol=1e-4, rtol=0)
    p_soft = 1 - scores.p_hard
    torch.testing.assert_close(p_soft[out.decided], out.p_soft[out.decided], atol=1e-4, rtol=0)


def test_tag_and_eos_state_machine(model, tokenizer):
    def ids(s):
        return tokenizer(s, add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    h = tokenizer.convert_tokens_to_ids("#")
    script = [
        ids("ab") + [h, h] + [h, h] + ids("42") + [eos],   # tag split over four steps
        ids("xyz") + ids("####") + ids("7") + [eos],        # tag as one token
        ids("no tag at all, ever") + [eos],
    ]
    backbone = ScriptedBackbone(model, script, model.config.vocab_size)
    enc = encode_prompts(tokenizer, ["q1", "q2", "q3"])
    spec = RolloutSpec(max_new_tokens=30, routing="soft", soft_top_k=3, compact_finished_rows=False)
    out = hybrid_generate(policy_of(backbone, tokenizer), enc.input_ids, enc.attention_mask, spec)
    for r, seq in enumerate(script):
        n = len(seq)
        assert out.token_ids[r, :n].tolist() == seq
        assert out.completion_mask[r].tolist() == [True] * n + [False] * (out.token_ids.shape[1] - n)
        # exact: integer ids; the entropy past the end is never written (0.0)
        assert (out.token_ids[r, n:] == pad).all() and (out.entropy[r, n:] == 0).all()
        assert not out.is_soft[r, n:].any() and not out.decided[r, n:].any()
    # Row 0: "a","b","#","#","#" decide (still thinking); the 4th "#" completes the tag.
    assert out.decided[0, :7].tolist() == [True] * 5 + [False] * 2
    assert out.decided[1, :5].tolist() == [True] * 3 + [False] * 2
    # Row 2 never emits the tag: every step but EOS is a (soft) thinking decision.
    assert out.decided[2, : len(script[2]) - 1].all() and not out.decided[2, len(script[2]) - 1]
    assert torch.equal(out.is_soft, out.decided)  # exact: boolean masks; routing "soft": thinking steps are all soft
    assert out.ended_with_eos.all()


def test_length_limit_truncates_without_eos(model, tokenizer):
    enc = encode_prompts(tokenizer, ["q"])
    script = [tokenizer("abcdefgh", add_special_tokens=False)["input_ids"]]
    backbone = ScriptedBackbone(model, script, model.config.vocab_size)
    spec = RolloutSpec(max_new_tokens=5, routing="soft", compact_finished_rows=False)
    out = hybrid_generate(policy_of(backbone, tokenizer), enc.input_ids, enc.attention_mask, spec)
    assert out.units.tolist() == [5] and not out.ended_with_eos.any()
    assert out.decided[0].tolist() == [True] * 4 + [False]  # the last step feeds nothing


def test_entropy_routing_rule(model, tokenizer):
    enc = encode_prompts(tokenizer, PROMPTS)
    hard = hybrid_generate(policy_of(Backbone(model), tokenizer), enc.input_ids, enc.attention_mask,
                           RolloutSpec(max_new_tokens=30, temperature=0.5, routing="hard"))
    threshold = hard.entropy[hard.decided].median().item()
    # entropy_temperature = T_s: the recorded entropy (of softmax(z / T_s)) is the one thresholded
    spec = RolloutSpec(max_new_tokens=30, temperature=0.5, routing="entropy", entropy_threshold=threshold,
                       entropy_temperature=0.5)
    out = hybrid_generate(policy_of(Backbone(model), tokenizer), enc.input_ids, enc.attention_mask, spec)
    assert torch.equal(out.is_soft, out.decided & (out.entropy > threshold))  # exact: boolean masks
    assert out.is_soft.any() and (out.decided & ~out.is_soft).any()


def test_learned_routing_soft_share_follows_router_bias(model, tokenizer):
    enc = encode_prompts(tokenizer, PROMPTS * 4)
    torch.manual_seed(2)
    router = Router(model.config.hidden_size, bias=[2.2, 0.0], init_std=0.0)  # rho(soft) = 1/(1+e^2.2)
    spec = RolloutSpec(max_new_tokens=40, routing="learned")
    out = hybrid_generate(policy_of(Backbone(model), tokenizer, router), enc.input_ids, enc.attention_mask, spec)
    expected = 1 / (1 + torch.exp(torch.tensor(2.2)))
    torch.testing.assert_close(out.p_soft[out.decided], expected.expand(int(out.decided.sum())))
    share = out.is_soft[out.decided].float().mean()
    assert abs(share - expected) < 0.05
    assert not out.is_soft[~out.decided].any()


# ---- host syncs: what would stall a GPU's decode loop (tests/syncs.py) ---------------------------------------
@pytest.mark.parametrize("routing", ["learned", "hrpo", "soft_tokens", "learned_gumbel"])
@pytest.mark.parametrize("keyed", [True, False])
def test_the_eager_loop_syncs_with_the_host_only_at_its_end_checks(model, tokenizer, routing, keyed):
    """Every DONE_CHECK_EVERY steps one read of the rows' state (it also drops the rows that ended); no
    other step reads anything on the host, draws keyed noise with a Python step number sent to the
    device, nor asks whether the padding mask could be skipped."""
    from syncs import per_decode_step
    from tarpo.engine.soft_input import GaussianSoftTokens, GumbelTopK, HrpoGate
    from tarpo.engine.records import DONE_CHECK_EVERY

    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = 1.0  # rows end at different steps, some between two checks
    backbone = BiasedBackbone(model, bias)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0])
    soft_input = {"hrpo": lambda: HrpoGate(model.config.hidden_size), "learned_gumbel": lambda: GumbelTopK(0.5),
                  "soft_tokens": lambda: GaussianSoftTokens.of_embedding(backbone.embed_weight)}.get(
                      routing, lambda: None)()
    spec = RolloutSpec(max_new_tokens=3 * DONE_CHECK_EVERY + 5, temperature=0.8, soft_top_k=5, routing=routing)
    kw = {"noise_seed": 7} if keyed else {"generator": torch.Generator().manual_seed(7)}
    enc = encode_prompts(tokenizer, PROMPTS)
    policy = policy_of(backbone, tokenizer, router, soft_input)
    per_step, out, counter = per_decode_step(lambda: hybrid_generate(policy, enc.input_ids, enc.attention_mask, spec,
                                                                     **kw))
    checks = [t for t in range(len(per_step)) if (t + 1) % DONE_CHECK_EVERY == 0]
    assert per_step == [int(t in checks) for t in range(len(per_step))], counter.report()
    assert checks and out.ended_with_eos.any() and out.is_soft.any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (the CPU test above counts the same points)")
def test_on_a_gpu_no_decode_step_between_end_checks_syncs(tokenizer, monkeypatch):
    """torch.cuda.set_sync_debug_mode("error") from the first decode step on, off only for the loop's end
    checks and the rollout's tail: any other host sync of the eager engine raises."""
    import tarpo.engine.rollout as rollout
    from tarpo.engine.records import DONE_CHECK_EVERY
    from tarpo.models.tiny import tiny_causal_lm

    model = tiny_causal_lm(tokenizer, "qwen2").cuda()
    step, check, tail = rollout.hybrid_step, rollout._end_check, rollout.steps_that_ran

    def strict(fn, mode):
        def run(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("default")
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(mode)
        return run
    monkeypatch.setattr(rollout, "hybrid_step",
                        lambda *a, **k: (torch.cuda.set_sync_debug_mode("error"), step(*a, **k))[1])
    monkeypatch.setattr(rollout, "_end_check", strict(check, "error"))
    monkeypatch.setattr(rollout, "steps_that_ran", strict(tail, "default"))
    enc = encode_prompts(tokenizer, PROMPTS).to("cuda")
    spec = RolloutSpec(max_new_tokens=2 * DONE_CHECK_EVERY + 3, temperature=0.8, soft_top_k=5, routing="learned")
    router = Router(model.config.hidden_size, bias=[0.0, 0.0]).cuda()
    try:
        out = hybrid_generate(policy_of(Backbone(model), tokenizer, router), enc.input_ids, enc.attention_mask, spec,
                              noise_seed=3)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.completion_mask.any()


def test_a_repeated_prompt_is_prefilled_once_and_its_rows_decode_as_a_full_forward(model, tokenizer):
    """A GRPO group (and ``tarpo eval --n``) repeats each prompt: the prefill runs on the distinct
    prompts alone, and every row's cached decode still equals one forward over its own inputs."""
    torch.manual_seed(0)
    backbone = Backbone(model)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0])
    enc = encode_prompts(tokenizer, [p for p in PROMPTS for _ in range(3)])
    spec = RolloutSpec(max_new_tokens=24, temperature=0.8, soft_top_k=5, routing="learned", answer_tag="####",
                       compact_finished_rows=False)
    batches = []
    orig = backbone.hidden
    backbone.hidden = lambda x, *a, **k: batches.append(x.shape[:2]) or orig(x, *a, **k)
    out = hybrid_generate(policy_of(backbone, tokenizer, router), enc.input_ids, enc.attention_mask, spec,
                          noise_seed=5)
    backbone.hidden = orig
    assert batches[0] == (len(PROMPTS), enc.input_ids.shape[1])  # one prefill row per distinct prompt
    assert batches[1][0] == 3 * len(PROMPTS)
    # exact: integer ids (the copies of one prompt part ways)
    assert out.is_soft.any() and not torch.equal(out.token_ids[0], out.token_ids[1])
    assert_training_forward_replays(backbone, router, out)
