"""The compiled engine (tarpo.engine.static_decode) against the eager one, given the same noise.

Both engines run on tiny Qwen2 and Llama models (grouped K/V heads) with a LoRA on every linear layer (the
compiled engine decodes with it merged into its weight copies, the eager one applies it as PEFT does), left-padded
prompts,
logits biased so that rows end at different steps and write the answer tag split across
steps, as one token and inside a token. Every routing mode is covered.
"""

import pytest
import torch
from torch._dynamo.utils import counters

from helpers import BiasedBackbone, encode_prompts, policy_of
from tarpo.engine.backbone import Backbone
from tarpo.engine.soft_input import TOP_K_MIXTURE, GaussianSoftTokens, GumbelTopK, HrpoGate
from tarpo.engine.mixture import topk_mixture
from tarpo.engine.rollout import RolloutSpec, hybrid_generate
from tarpo.engine.router import Router
from tarpo.engine.sampling import STREAM_TOKEN, gumbel_argmax, row_keys, step_normals, step_uniforms
from tarpo.training.scoring import ScoreSettings, score_rollout
from tarpo.engine.grouped_attention import grouped_decode_attention
from tarpo.engine.tagging import token_text_fn

PROMPTS = ["what is 2+3?", "hi", "a longer prompt, with padding", "x"]
EXACT = ("token_ids", "completion_mask", "is_soft", "decided", "soft_ids", "ended_with_eos")
CLOSE = ("soft_weights", "p_soft", "entropy", "logp", "soft_inputs")


def tag_world(tokenizer, model):
    """A token_text function where "x" reads "x####y" (the tag inside a token), and logit biases that
    make "#", "##", "x" and EOS likely: tags split over steps, whole, inside a token; rows end
    at different steps."""
    base = token_text_fn(tokenizer)
    x = tokenizer.convert_tokens_to_ids("x")

    def token_text(tok):
        return "x####y" if tok == x else base(tok)

    bias = torch.zeros(model.config.vocab_size)
    for tok, b in (("#", 2.5), ("##", 1.5), ("x", 0.5), (tokenizer.eos_token, 1.2)):
        bias[tokenizer.convert_tokens_to_ids(tok)] = b
    return token_text, bias


def with_lora(model):
    """``model`` with a LoRA of r 4 on every linear layer whose B is not zero (a trained adapter's), so that the
    compiled engine's merged decode weights (TarpoConfig.decode_merge, "all" by default) differ from the model's."""
    from peft import LoraConfig, get_peft_model

    if "_test_lora" not in vars(model):  # once per model (PEFT injects its layers into it)
        torch.manual_seed(1)
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=targets))
        object.__setattr__(model, "_test_lora", lora.eval())  # kept beside the module, not as its submodule
    return vars(model)["_test_lora"]


def run_both(model, tokenizer, routing, seed=0, **spec_kw):
    model = with_lora(model)
    token_text, bias = tag_world(tokenizer, model)
    backbone = BiasedBackbone(model, bias)
    torch.manual_seed(seed)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0], init_std=0.05)
    soft_input = TOP_K_MIXTURE
    if routing == "hrpo":
        soft_input = HrpoGate(model.config.hidden_size, mixture=spec_kw.pop("mixture", "full"), a_range=(0.5, 0.6))
    elif routing == "soft_tokens":
        soft_input = GaussianSoftTokens.of_embedding(backbone.embed_weight)
    elif routing == "learned_gumbel":
        soft_input = GumbelTopK(0.5)
    enc = encode_prompts(tokenizer, PROMPTS)
    out = {}
    for engine in ("eager", "compiled"):
        spec = RolloutSpec(max_new_tokens=spec_kw.pop("max_new_tokens", 40) if engine == "eager" else out["T"],
                           temperature=0.8, soft_top_k=5, routing=routing, engine=engine, **spec_kw)
        out["T"] = spec.max_new_tokens
        policy = policy_of(backbone, tokenizer, router, soft_input, token_text)
        out[engine] = hybrid_generate(policy, enc.input_ids, enc.attention_mask, spec, noise_seed=seed + 11)
    return backbone, router, soft_input, out["eager"], out["compiled"]


def assert_same(eager, compiled):
    for name in EXACT:
        a, b = getattr(eager, name), getattr(compiled, name)
        assert a.shape == b.shape and torch.equal(a, b), name  # exact: EXACT names integer ids and boolean masks
    for name in CLOSE:
        a, b = getattr(eager, name), getattr(compiled, name)
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)


ROUTINGS = [
    ("learned", {}), ("learned", {"router_greedy": True, "top_k": 20, "top_p": 0.9}), ("hard", {}), ("soft", {}),
    ("entropy", {"entropy_threshold": 2.0}), ("hrpo", {}), ("hrpo", {"mixture": "top_k"}), ("soft_tokens", {}),
    ("learned", {"greedy": True}), ("learned_gumbel", {}), ("learned", {"min_p": 0.05}),
]


# Every routing of both architectures is compared with the eager engine under aot_eager, the same traced graph
# run without code generation (tests/conftest.py); inductor's code runs in the one-graph test below for both
# architectures and both mixtures (Qwen2 with TARPO's top-k mixture, Llama with HRPO's full-vocabulary one): a
# graph is 20-40 s of C++ generation and compilation on a cold cache (2 cores), so each is compiled once


@pytest.mark.parametrize("routing,kw", ROUTINGS, ids=[f"{r}-{'-'.join(k) or 'default'}" for r, k in ROUTINGS])
def test_compiled_engine_draws_the_eager_trajectory_given_the_same_noise(model, tokenizer, routing, kw):
    backbone, router, soft_input, eager, compiled = run_both(model, tokenizer, routing, **kw)
    assert_same(eager, compiled)
    units = eager.units
    if not kw.get("greedy"):
        assert units.min() < units.max() and eager.ended_with_eos.any(), "rows should end at different steps"
        thinking_ended = eager.completion_mask & ~eager.decided
        assert (thinking_ended.sum(-1) > 1).any(), "some row should write the tag and go on"
    if routing in ("learned", "entropy") and not kw:
        assert eager.is_soft.any() and (eager.decided & ~eager.is_soft).any()


@pytest.mark.parametrize("routing", ["learned", "hrpo", "soft_tokens"])
def test_training_forward_rebuilds_the_compiled_rollout(model, tokenizer, routing):
    backbone, router, soft_input, _, compiled = run_both(model, tokenizer, routing)
    assert compiled.is_soft.any()
    with torch.no_grad():
        scores = score_rollout(backbone, router, None, compiled,
                               ScoreSettings(temperature=0.8, chunk_size=7, use_router=routing == "learned",
                                             with_reference=False), soft_input=soft_input)
    m = compiled.completion_mask
    torch.testing.assert_close(scores.logp_tok[m], compiled.logp[m], atol=1e-4, rtol=0)
    if routing == "learned":
        torch.testing.assert_close(1 - scores.p_hard[compiled.decided], compiled.p_soft[compiled.decided],
                                   atol=1e-4, rtol=0)


# the routing whose graph each architecture's inductor test compiles: both mixtures, TARPO's and HRPO's
INDUCTOR_ROUTING = {"qwen2": "learned", "llama": "hrpo"}


@pytest.mark.inductor
def test_compiled_step_has_no_graph_break_and_is_reused(model, tokenizer, arch):
    """inductor's code: the step compiles to one graph without a break, draws the eager trajectory, and a second
    rollout of another prompt length and seed reuses the graph and draws the eager trajectory again."""
    routing = INDUCTOR_ROUTING[arch]
    torch._dynamo.reset()  # forget graphs compiled by earlier tests, so this one counts its own
    counters.clear()
    _, _, soft_input, eager, compiled = run_both(model, tokenizer, routing, seed=5)
    assert counters["stats"]["unique_graphs"] == 1, "the step was not compiled, or compiled more than once"
    assert not counters["graph_break"], dict(counters["graph_break"])  # fullgraph=True would also raise
    assert_same(eager, compiled)
    assert compiled.is_soft.any(), "the mixture's code ran"
    graphs = counters["stats"]["unique_graphs"]
    # a second rollout of the same shape (another prompt length in the same cache bucket, another seed)
    # reuses the graph, and the engine's cache and buffers, reset
    token_text, bias = tag_world(tokenizer, model)
    enc = encode_prompts(tokenizer, ["another prompt, 27 chars...", "q", "and one more", "?"])
    assert enc.input_ids.shape[1] != eager.prompt_ids.shape[1]
    router = Router(model.config.hidden_size, bias=[0.0, 0.0], init_std=0.05)
    out = {}
    for engine in ("compiled", "eager"):
        spec = RolloutSpec(max_new_tokens=40, temperature=0.8, soft_top_k=5, routing=routing, engine=engine)
        policy = policy_of(BiasedBackbone(model, bias), tokenizer, router, soft_input, token_text)
        out[engine] = hybrid_generate(policy, enc.input_ids, enc.attention_mask, spec, noise_seed=3)
    assert counters["stats"]["unique_graphs"] == graphs
    assert_same(out["eager"], out["compiled"])


def test_a_rollout_reruns_identically_on_the_reused_engine(model, tokenizer):
    _, _, _, _, first = run_both(model, tokenizer, "learned", seed=2)
    _, _, _, _, again = run_both(model, tokenizer, "learned", seed=2)
    assert_same(first, again)


def test_the_compiled_engine_decodes_a_backbone_with_its_own_decode_path(model, tokenizer, monkeypatch):
    """A backbone whose model decodes through its own path (Unsloth's, stood in for) rolls out through the
    compiled step, which reads the model's tensors, and draws what its eager decode draws."""
    from helpers import stand_in_unsloth_decode
    from tarpo.models.backends import UnslothBackbone, make_backbone

    stand_in_unsloth_decode(model, monkeypatch)
    backbone = make_backbone(model)
    assert isinstance(backbone, UnslothBackbone)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0], init_std=0.05)
    enc = encode_prompts(tokenizer, PROMPTS)
    out = {}
    for engine in ("eager", "compiled"):
        spec = RolloutSpec(max_new_tokens=20, temperature=0.8, soft_top_k=5, engine=engine)
        out[engine] = hybrid_generate(policy_of(backbone, tokenizer, router), enc.input_ids, enc.attention_mask, spec,
                                      noise_seed=5)
    assert out["eager"].is_soft.any()
    assert_same(out["eager"], out["compiled"])


def test_grouped_decode_attention_equals_sdpa_with_repeated_heads():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    B, H, kv, L, D = 3, 8, 2, 11, 16
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = H // kv, True
    q, k, v = torch.randn(B, H, 1, D), torch.randn(B, kv, L, D), torch.randn(B, kv, L, D)
    mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
    mask[0, ..., :4] = False  # left padding
    mask[2, ..., 7:] = False  # positions not written yet
    ours, _ = grouped_decode_attention(module, q, k, v, mask, scaling=0.25)
    ref, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert ours.shape == ref.shape == (B, 1, H, D)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)


def test_a_row_mixture_does_not_depend_on_the_other_rows():
    torch.manual_seed(0)
    E = torch.randn(50, 24).to(torch.bfloat16)
    ids, w = torch.randint(0, 50, (64, 30)), torch.rand(64, 30).softmax(-1)
    full = topk_mixture(E, ids, w)
    for rows in (slice(0, 1), slice(5, 9), torch.tensor([3, 60, 17])):
        # exact: elementwise products and a per-row sum over k (no matmul): the property tested
        assert torch.equal(topk_mixture(E, ids[rows], w[rows]), full[rows])


def test_gumbel_draws_on_keyed_noise_follow_the_token_policy():
    scores = torch.log(torch.tensor([0.5, 0.3, 0.2, 0.0]))  # the last token filtered out (-inf)
    u = step_uniforms(row_keys(0, torch.arange(40000)), 3, STREAM_TOKEN, 4)
    freq = torch.bincount(gumbel_argmax(scores.expand(40000, 4), u), minlength=4).float() / 40000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.01, rtol=0)  # ~4 std


def test_keyed_noise_is_uniform_independent_and_the_same_in_any_batch():
    keys = row_keys(123, torch.arange(2000))
    u = step_uniforms(keys, 0, STREAM_TOKEN, 500)
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.002 and abs(u.var() - 1 / 12) < 0.001
    # neighbouring rows, steps, streams and indices are uncorrelated
    other_seed = step_uniforms(row_keys(124, torch.arange(2000)), 0, STREAM_TOKEN, 500)
    for a, b in [(u[:-1], u[1:]), (u[:, :-1], u[:, 1:]), (u, step_uniforms(keys, 1, STREAM_TOKEN, 500)),
                 (u, step_uniforms(keys, 0, STREAM_TOKEN + 1, 500)), (u, other_seed)]:
        assert abs(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1]) < 0.01
    z = step_normals(keys, 0, 2, 500)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    # row 1500 draws the same in a batch of its own, with any id around it
    alone = step_uniforms(row_keys(123, torch.tensor([1500])), 0, STREAM_TOKEN, 500)
    assert torch.equal(alone[0], u[1500])  # exact: integer hashing, then an exact int-to-float scaling


# ---- what a GPU does to the compiled step (modelled on CPU) -------------------------------------------

def poison(x: torch.Tensor) -> None:
    """Overwrite a tensor as a graph runtime that reuses its output memory would: NaN, flipped
    bools, out-of-range integers."""
    if x.is_floating_point():
        x.fill_(float("nan"))
    elif x.dtype == torch.bool:
        x.logical_not_()
    else:
        x.fill_(2 ** 40 + 7)


def poisoning_steps(monkeypatch):
    """The contract of CUDA graph trees (``mode="reduce-overhead"``): calling the compiled step
    again overwrites every tensor its previous call returned (pytorch/pytorch#175557). Modelled
    by poisoning them before each call."""
    from torch.utils._pytree import tree_flatten

    from tarpo.engine import static_decode

    original = static_decode.compiled_step

    def poisoned(device):
        step = original(device)
        previous = []

        def run(*args):
            for x in previous:
                poison(x)
            previous.clear()
            out = step(*args)
            previous.extend(x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor))
            return out
        return run
    monkeypatch.setattr(static_decode, "compiled_step", poisoned)


@pytest.mark.parametrize("routing", ["learned", "hrpo"])
def test_the_trajectory_survives_a_runtime_that_overwrites_the_steps_outputs(model, tokenizer, routing,
                                                                              monkeypatch):
    poisoning_steps(monkeypatch)
    _, _, _, eager, compiled = run_both(model, tokenizer, routing, seed=4)
    assert_same(eager, compiled)


def test_the_rollouts_cache_and_buffers_are_released_when_it_returns(model, tokenizer, monkeypatch):
    import gc
    import weakref

    from tarpo.engine.static_decode import DecodeBuffers

    made, init = [], DecodeBuffers.__init__

    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append([*(weakref.ref(t) for kv in self.cache for t in kv), *(weakref.ref(b) for b in self.rec.values())])
    monkeypatch.setattr(DecodeBuffers, "__init__", tracked)
    run_both(model, tokenizer, "learned", seed=6)
    gc.collect()
    assert made and all(ref() is None for refs in made for ref in refs), "the rollout's cache is still held"


def test_one_graph_serves_every_prompt_length_and_smaller_batch_of_a_run(model, tokenizer):
    """The run's shape (prompt budget, batch) fixes the graph: prompts of other lengths and a
    smaller batch (padded with rows that never run) reuse it, and draw what the eager engine draws."""
    torch._dynamo.reset()
    counters.clear()
    token_text, bias = tag_world(tokenizer, model)
    backbone = BiasedBackbone(model, bias)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0], init_std=0.05)
    batches = [PROMPTS, ["q", "a much longer prompt than any other here, by far", "z"], ["hi", "x"]]
    for i, prompts in enumerate(batches):
        enc = encode_prompts(tokenizer, prompts)
        out = {}
        for engine in ("eager", "compiled"):
            spec = RolloutSpec(max_new_tokens=30, temperature=0.8, soft_top_k=5, engine=engine,
                               max_prompt_length=64, batch_size=5)
            policy = policy_of(backbone, tokenizer, router, token_text=token_text)
            out[engine] = hybrid_generate(policy, enc.input_ids, enc.attention_mask, spec, noise_seed=20 + i)
        assert out["compiled"].token_ids.shape[0] == len(prompts)
        assert_same(out["eager"], out["compiled"])
    assert counters["stats"]["unique_graphs"] == 1


def test_attention_over_the_written_slots_draws_what_the_full_cache_draws(model, tokenizer, monkeypatch):
    """Spans of 64 slots (the bucket made small, so that a rollout of this model crosses one): the steps attend
    over the first 64 cache slots while the write position is below 64, then over all 128; one compiled graph
    serves both spans. The same tokens and routes as attending over the whole cache, and as the eager engine
    (which attends over exactly what is written); the floats within 1e-5 (fp32: the masked slots add exact
    zeros, and only the softmax's reduction runs over a different length)."""
    from tarpo.engine import step_replay

    token_text, bias = tag_world(tokenizer, model)
    backbone = BiasedBackbone(model, bias)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0], init_std=0.05)
    enc = encode_prompts(tokenizer, PROMPTS)
    spans, runner = [], step_replay.step_runner

    def recording_runner(call, mask, device):
        run = runner(call, mask, device)
        return lambda span: (spans.append(span), run(span))
    monkeypatch.setattr(step_replay, "step_runner", recording_runner)
    out = {}
    for name, bucket, engine in (("eager", 64, "eager"), ("full", 10**6, "compiled"), ("spans", 64, "compiled")):
        monkeypatch.setattr(step_replay, "ATTENTION_BUCKET", bucket)
        spec = RolloutSpec(max_new_tokens=60, temperature=0.8, soft_top_k=5, engine=engine, max_prompt_length=64)
        spans.clear()
        counters.clear()
        policy = policy_of(backbone, tokenizer, router, token_text=token_text)
        out[name] = hybrid_generate(policy, enc.input_ids, enc.attention_mask, spec, noise_seed=31)
        out[name + "_spans"] = sorted(set(spans))
    assert out["full_spans"] == [128] and out["spans_spans"] == [64, 128]
    # exact: a count of graphs; the full-cache rollout's graph served the 64-slot span too
    assert counters["stats"]["unique_graphs"] == 0
    assert out["spans"].token_ids.shape[1] > 64 - enc.input_ids.shape[1]  # it wrote past slot 64
    assert_same(out["full"], out["spans"])
    assert_same(out["eager"], out["spans"])


def test_the_compiled_engine_refuses_prompts_or_batches_beyond_the_runs_shape(model, tokenizer):
    enc = encode_prompts(tokenizer, PROMPTS)
    for kw, match in (({"max_prompt_length": 8}, "max_prompt_length=8"), ({"batch_size": 2}, "batch_size=2")):
        spec = RolloutSpec(max_new_tokens=4, engine="compiled", routing="hard", **kw)
        with pytest.raises(ValueError, match=match):
            hybrid_generate(policy_of(Backbone(model), tokenizer), enc.input_ids, enc.attention_mask, spec)


class FakeCuda:
    """The few ``torch.cuda`` calls of :class:`tarpo.engine.step_replay.GraphedStep`, on the CPU: streams,
    their contexts, a graph whose capture runs the step once and whose replay counts."""

    def __init__(self, monkeypatch):
        import contextlib

        self.streams, self.graphs, self.replays, self.pools = 0, 0, 0, []
        fake = self

        class Stream:
            def __init__(self):
                fake.streams += 1

            def wait_stream(self, other):
                pass

        class Graph:
            def __init__(self):
                fake.graphs += 1

            def replay(self):
                fake.replays += 1

        for name, value in dict(Stream=Stream, CUDAGraph=Graph, current_stream=lambda *a: Stream.__new__(Stream),
                                current_device=lambda: 0, stream=lambda s: contextlib.nullcontext(),
                                graph=lambda g, pool=None: fake.pools.append(pool) or contextlib.nullcontext(),
                                graph_pool_handle=lambda: object()).items():
            monkeypatch.setattr(torch.cuda, name, value)


def test_captured_steps_share_one_side_stream_per_process(monkeypatch):
    """Each rollout warms its step up on a side stream before capturing it, once per attention span; the stream
    is the process's one (per device), not one per rollout (the caching allocator keeps a cuBLAS workspace per
    stream), and a rollout's graphs share one memory pool."""
    from tarpo.engine import step_replay

    monkeypatch.setattr(step_replay, "_SIDE_STREAMS", {}, raising=False)
    cuda = FakeCuda(monkeypatch)
    calls, mask = [], torch.ones(2, 512)
    for rollout in range(3):
        run = step_replay.step_runner(lambda view: calls.append(view.shape[1]), mask, "cuda")
        for span in (256, 256, 256, 256, 256, 512, 512, 512):
            run(span)
    assert cuda.streams == 1 and cuda.graphs == 3 * 2 and len(set(cuda.pools)) == 3
    assert len(cuda.pools) == 3 * 2  # every capture names its rollout's pool
    # warm-up and capture run the step, at each span; then replays
    assert calls == [256, 256, 512, 512] * 3 and cuda.replays == 3 * (4 + 2)


def test_the_decode_steps_dynamo_settings_do_not_reach_other_compiled_functions(monkeypatch):
    """The step allows more recompiles than dynamo's default and fails past them: set while it runs (when
    dynamo compiles it), dynamo's defaults everywhere else."""
    from tarpo.engine import static_decode

    config = torch._dynamo.config
    defaults = (config.recompile_limit, config.fail_on_recompile_limit_hit)
    seen = []
    monkeypatch.setattr(static_decode, "_COMPILED", {})
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: lambda *a: seen.append(
        (config.recompile_limit, config.fail_on_recompile_limit_hit)))
    step = static_decode.compiled_step("cpu")
    assert (config.recompile_limit, config.fail_on_recompile_limit_hit) == defaults
    step()
    assert seen == [(static_decode.RECOMPILE_LIMIT, True)]
    assert (config.recompile_limit, config.fail_on_recompile_limit_hit) == defaults == (8, False)


def test_each_distinct_prompt_is_prefilled_once(model, tokenizer, monkeypatch):
    """A GRPO group's copies of one prompt (and the rows that pad the batch) are prefilled by one forward of each
    distinct prompt, whose keys and values every copy gets: the compiled engine still draws the eager trajectory."""
    from tarpo.engine import functional_decoder

    made, new_cache = [], functional_decoder.new_cache

    def recording(w, batch, *args):
        made.append(batch)
        return new_cache(w, batch, *args)
    monkeypatch.setattr(functional_decoder, "new_cache", recording)
    monkeypatch.setitem(globals(), "PROMPTS", [PROMPTS[0]] * 3 + [PROMPTS[2]] * 3)
    *_, eager, compiled = run_both(model, tokenizer, "learned", seed=3, batch_size=8)
    assert made == [8, 2]  # the engine's cache for the run's batch of 8, then one prefill row per distinct prompt
    assert_same(eager, compiled)
    # exact: token ids; the copies sample apart after the prompt
    assert not torch.equal(compiled.token_ids[0], compiled.token_ids[1])
