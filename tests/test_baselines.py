"""HRPO and Soft Tokens (docs/algorithm.md §3) in the shared engine, and every ALGO of the launchers."""

import json
import math
from dataclasses import replace

import pytest
import torch

from helpers import loss_of
from helpers import BiasedBackbone, policy_of, encode_prompts
from tarpo.config import TarpoConfig
from tarpo.engine.soft_input import TOP_K_MIXTURE, GaussianSoftTokens, HrpoGate
from tarpo.engine.mixture import build_inputs_embeds, normalised_full_mixture
from tarpo.training.objective import LossSettings
from tarpo.algorithms import ALGOS
from tarpo.engine.rollout import RolloutSpec, hybrid_generate
from tarpo.engine.sampling import filter_logits
from tarpo.training.scoring import ScoreSettings, score_rollout, sequence_hidden
from tarpo.models.tiny import tiny_causal_lm
from tarpo.training.trainer import TarpoTrainer
from helpers import DATA, ROOT, letter_reward, make_args, make_dataset, needs_data


def test_hrpo_gate_starts_with_at_least_99_percent_token_embedding():
    gate = HrpoGate(64, seed=0, init_std=0.02)
    for linear in (gate.r, gate.i):  # HRPO: the model's _init_weights, N(0, initializer_range), zero bias
        assert abs(linear.weight.std().item() - 0.02) < 1e-3 and abs(linear.weight.mean().item()) < 1e-3
        assert (linear.bias == 0).all()  # exact: HrpoGate zeroes the biases (bias.zero_())
    a_min = torch.exp(-gate.c * torch.nn.functional.softplus(-gate.lam))
    assert 0.99 <= a_min.min() and a_min.max() <= 0.999 and a_min.std() > 1e-3  # ~U[0.99, 0.999]
    e = torch.randn(100, 64)
    a = gate.blend_weight(e)
    assert a.min() >= 0.99 and a.max() < 1
    m = torch.randn(100, 64)
    for mixture in ("full", "top_k"):
        gate.mixture = mixture
        m_hat = m if mixture == "full" else m * e.norm(dim=-1, keepdim=True) / m.norm(dim=-1, keepdim=True)
        hand = a * e + torch.sqrt(1 - a * a + 1e-8) * torch.sigmoid(gate.i(e)) * m_hat
        torch.testing.assert_close(gate(e, m), hand)
    assert ((gate(e, m) - e).norm(dim=-1) < 0.2 * e.norm(dim=-1)).all()  # mostly the token embedding


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize("top_k", [0, 2])
def test_hrpo_default_is_hrpos_formula_by_hand(top_k):
    """HRPO's code: m = (p . E) / |p|_2 over the vocabulary, p the (filtered) sampling distribution;
    u = a e + sqrt(1 - a^2 + 1e-8) (i * m), a = exp(-8 softplus(-Lambda) r), r = sig(W_r e + b_r),
    i = sig(W_i e + b_i)."""
    args = TarpoConfig(output_dir="unused", report_to="none", bf16=False, routing="hrpo")
    assert (args.hrpo_mixture, args.hrpo_lr, args.hrpo_lambda_lr) == ("full", 1e-4, 1e-3)
    E = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    z, T = [2.0, 1.0, 0.0], 0.5
    kept = 3 if top_k == 0 else top_k  # the top-k filter keeps the first `kept` (largest) logits
    w = [math.exp(z[j] / T) if j < kept else 0.0 for j in range(3)]
    p = [x / sum(w) for x in w]
    norm = math.sqrt(sum(x * x for x in p))
    m = [sum(p[j] * E[j, c].item() for j in range(3)) / norm for c in range(2)]

    gate = HrpoGate(2, mixture=args.hrpo_mixture)
    W_r, b_r, lam = [[0.1, -0.2], [0.3, 0.0]], [0.05, -0.05], [2.0, -1.0]
    W_i, b_i = [[0.0, 0.4], [-0.5, 0.1]], [0.2, 0.0]
    with torch.no_grad():
        gate.r.weight.copy_(torch.tensor(W_r)), gate.r.bias.copy_(torch.tensor(b_r))
        gate.i.weight.copy_(torch.tensor(W_i)), gate.i.bias.copy_(torch.tensor(b_i))
        gate.lam.copy_(torch.tensor(lam))
    v = 1  # the sampled token: e = E(v) = (0, 2)
    e = [E[v, c].item() for c in range(2)]
    u = []
    for c in range(2):
        r = sigmoid(sum(W_r[c][k] * e[k] for k in range(2)) + b_r[c])
        i = sigmoid(sum(W_i[c][k] * e[k] for k in range(2)) + b_i[c])
        a = math.exp(-8.0 * math.log1p(math.exp(-lam[c])) * r)
        u.append(a * e[c] + math.sqrt(1 - a * a + 1e-8) * i * m[c])

    mixed = normalised_full_mixture(filter_logits(torch.tensor([z]), T, top_k=top_k), E)  # what the rollout records
    torch.testing.assert_close(mixed, torch.tensor([m]), rtol=0, atol=1e-6)
    fed = build_inputs_embeds(E, torch.tensor([v]), torch.tensor([True]), gate, dict(soft_inputs=mixed))
    torch.testing.assert_close(fed, torch.tensor([u]), rtol=0, atol=1e-6)


def test_soft_tokens_noise_is_a_third_of_the_embedding_rms_and_the_likelihood_is_gaussian(tokenizer):
    model = tiny_causal_lm(tokenizer)
    E = model.get_input_embeddings().weight
    noise = GaussianSoftTokens.of_embedding(E)
    assert noise.sigma == pytest.approx(0.33 * E.detach().pow(2).mean().sqrt().item())
    logits = torch.randn(3, E.shape[0])
    mean = GaussianSoftTokens.mean(logits, E)
    torch.testing.assert_close(mean, torch.softmax(logits, -1) @ E.detach())
    u = GaussianSoftTokens.input(logits, E, noise.sigma, torch.randn(3, E.shape[1], generator=torch.Generator()
                                                                    .manual_seed(0)))  # the rollout's draw
    assert ((u - mean).std() / noise.sigma - 1).abs() < 0.1
    ref = torch.distributions.Normal(mean, noise.sigma).log_prob(u).sum(-1)
    torch.testing.assert_close(noise.log_likelihood(u, mean), ref)


def test_loss_terms_of_the_latent_baselines_by_hand():
    kw = dict(logp_act=torch.zeros(1, 3), p_hard=torch.ones(1, 3), kl_tok=torch.zeros(1, 3),
              kl_act=torch.zeros(1, 3), advantages=torch.tensor([2.0]), completion_mask=torch.ones(1, 3, dtype=bool),
              is_soft=torch.tensor([[True, False, False]]), decided=torch.tensor([[True, True, False]]))
    settings = LossSettings(lambda_act=0.1, beta=0.0, alpha=1.0, use_router=False)
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    tarpo, _ = loss_of(settings, logp_tok=logp, **kw)
    assert tarpo.item() == pytest.approx(-(-2 - 3) * 2 / 3)  # the soft step's placeholder is out
    hrpo, _ = loss_of(replace(settings, token_loss_on_soft=True), logp_tok=logp, **kw)
    assert hrpo.item() == pytest.approx(-(-1 - 2 - 3) * 2 / 3)  # the blended token was fed: in
    log_density = torch.tensor([[-10.0, 99.0, 99.0]])  # only the soft step's Gaussian term counts
    soft_tokens, _ = loss_of(settings, logp_tok=logp, logp_soft_input=log_density, **kw)
    assert soft_tokens.item() == pytest.approx(-(-2 - 3 - 10) * 2 / 3)


@pytest.mark.parametrize("routing, mixture", [("hrpo", "full"), ("hrpo", "top_k"), ("soft_tokens", None)])
def test_latent_rollouts_are_rebuilt_exactly_by_the_training_forward(model, tokenizer, routing, mixture):
    torch.manual_seed(0)
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = 3.0 if routing == "hrpo" else 1.5  # rows end at different steps (compaction)
    backbone = BiasedBackbone(model, bias)
    E = backbone.embed_weight
    soft_input = (HrpoGate(model.config.hidden_size, a_range=(0.5, 0.6), mixture=mixture) if routing == "hrpo"
                  else GaussianSoftTokens.of_embedding(E))
    enc = encode_prompts(tokenizer, ["what is 2+3?", "hi", "a longer prompt here"])
    spec = RolloutSpec(max_new_tokens=40, temperature=0.8, top_k=20 if routing == "hrpo" else 0, soft_top_k=5,
                       routing=routing)
    out = hybrid_generate(policy_of(backbone, tokenizer, soft_input=soft_input), enc.input_ids, enc.attention_mask,
                          spec)
    m = out.completion_mask
    # exact: boolean masks
    assert out.is_soft.any() and (out.is_soft == out.decided).all()  # every thinking step is soft
    assert out.units.min() < out.units.max()
    with torch.no_grad():
        scores = score_rollout(backbone, None, None, out,
                               ScoreSettings(temperature=0.8, chunk_size=7, use_router=False, with_reference=False),
                               soft_input=soft_input)
    torch.testing.assert_close(scores.logp_tok[m], out.logp[m], atol=1e-4, rtol=0)
    assert out.soft_inputs.shape[-1] == (0 if mixture == "top_k" else model.config.hidden_size)
    if mixture == "full":  # the recorded m is HRPO's (p . E) / |p|_2 of the top-20-filtered logits that step
        soft = m & out.is_soft
        with torch.no_grad():
            logits = backbone.logits(sequence_hidden(backbone, out, soft_input)[soft]).float()
        hand = normalised_full_mixture(filter_logits(logits, 0.8, top_k=20), E)
        torch.testing.assert_close(out.soft_inputs[soft], hand, atol=1e-4, rtol=1e-4)
    if routing == "soft_tokens":
        assert out.soft_inputs.shape[-1] == model.config.hidden_size
        soft = m & out.is_soft
        # exact: masked zeros (only the soft steps are written)
        assert scores.logp_soft_input is not None and (scores.logp_soft_input[~soft] == 0).all()
        # On-policy the recorded input is mean + sigma * eps, so log N = -|eps|^2 / 2 - d log(sigma sqrt(2 pi))
        # with eps ~ N(0, I): |eps|^2 / d averages 1 over the soft steps.
        d = model.config.hidden_size
        const = d * (math.log(soft_input.sigma) + 0.5 * math.log(2 * math.pi))
        eps2 = -2 * (scores.logp_soft_input[soft] + const)
        assert soft.sum() >= 20 and abs(eps2.mean().item() / d - 1) < 0.15


@pytest.mark.parametrize("algo", list(ALGOS))
def test_every_algo_trains_and_changes_every_trainable_parameter(tokenizer, tmp_path, algo):
    args = make_args(tmp_path, routing=ALGOS[algo].name, max_steps=3, hrpo_lr=1e-1)
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, seed=2), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in trainable)
    assert any("tarpo_router" in n for n in trainable) == ALGOS[algo].router
    assert any("tarpo_soft_input" in n for n in trainable) == ALGOS[algo].soft.trained
    for n, p in trainer.model.named_parameters():
        # exact: a frozen tensor is never written; a trained one moves
        assert torch.equal(p, before[n]) != (n in trainable), f"{n}: trainable={n in trainable}"
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3 and all(math.isfinite(h["loss"]) for h in logs)
    if algo in ("hrpo", "soft_tokens", "grpo_pure_latent", "tarpo_gumbel"):
        assert all(h["soft_ratio"] > 0 for h in logs)
    if algo == "hrpo":  # LoRA, gate W_r and W_i, Lambda (the router is frozen: no group); decay as HRPO's
        groups = trainer.optimizer.param_groups
        assert [g["initial_lr"] for g in groups] == [args.learning_rate, 1e-1, 1e-3]
        assert [g["weight_decay"] for g in groups] == [args.weight_decay] * 3
        assert groups[2]["params"] == [trainer.soft_input.lam]


def test_hrpo_gate_is_saved_and_evaluated(tokenizer, tmp_path):
    from safetensors.torch import save_file

    from tarpo.evaluation.sample import sample
    from tarpo.evaluation.system import System
    from tarpo.engine.soft_input import HRPO_WEIGHTS

    args = make_args(tmp_path, routing="hrpo", max_steps=1)
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, seed=2), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    gate = HrpoGate.load(str(tmp_path / "adapter"))
    for k, v in trainer.soft_input.state_dict().items():
        torch.testing.assert_close(gate.state_dict()[k], v)
    # evaluation blends as training
    assert gate.mixture == trainer.soft_input.mixture == "full" and gate.c == args.hrpo_c
    old = tmp_path / "old"  # a gate of an earlier commit (its mixture not recorded) is refused, naming the file
    old.mkdir()
    save_file({k: v.contiguous() for k, v in gate.state_dict().items()}, str(old / HRPO_WEIGHTS),
              metadata={"c": "8.0"})
    with pytest.raises(ValueError, match=r"old/hrpo_gate.safetensors: no mixture in its metadata"):
        HrpoGate.load(str(old))
    examples = [{"id": "q", "prompt": [{"role": "user", "content": "question 1?"}]}]
    system = System(trainer.model, None, gate, tokenizer, torch.device("cpu"), "hrpo")
    recs = sample(system, examples, 2, RolloutSpec(max_new_tokens=8), max_prompt_length=64,
                  generator=torch.Generator().manual_seed(0))
    assert len(recs) == 2 and all(r["soft_steps"] > 0 for r in recs)
    with pytest.raises(ValueError, match="routing='hrpo' needs its soft input 'hrpo_gate'"):
        sample(system._replace(soft_input=TOP_K_MIXTURE), examples, 1, RolloutSpec(max_new_tokens=4),
               max_prompt_length=64)


def test_entropy_routing_thresholds_the_entropy_at_entropy_temperature(model, tokenizer):
    """Two likely tokens: at T = 1 the distribution is flat enough to exceed the threshold, at T_s = 0.5 it is not,
    so routing on the sampling distribution's entropy goes soft less often (never, here)."""
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.convert_tokens_to_ids(["a", "b"])] = 3.0
    backbone = BiasedBackbone(model, bias)
    enc = encode_prompts(tokenizer, ["what is 2+3?", "hi"])
    outs = {}
    for temp in (1.0, 0.5):
        torch.manual_seed(0)
        spec = RolloutSpec(max_new_tokens=20, temperature=0.5, routing="entropy", entropy_threshold=2.5,
                           entropy_temperature=temp)
        assert RolloutSpec(max_new_tokens=1, routing="entropy").entropy_temperature == 1.0  # the default
        outs[temp] = hybrid_generate(policy_of(backbone, tokenizer), enc.input_ids, enc.attention_mask, spec)
    assert outs[1.0].decided.sum() >= 30 and torch.equal(outs[1.0].is_soft, outs[1.0].decided)  # exact: boolean masks
    assert outs[0.5].decided.any() and not outs[0.5].is_soft.any()
    assert (outs[0.5].entropy[outs[0.5].completion_mask] < 2.5).all()  # the logged entropy is still at T_s


@pytest.mark.parametrize("temp, soft", [(1e-5, False), (100.0, True)])
def test_entropy_temperature_works_in_training(tokenizer, tmp_path, temp, soft):
    # tiny random model: at T = 1e-5 the entropy is ~0, at T = 100 ~log V; the threshold 0.5 lies between
    args = make_args(tmp_path, routing="entropy", entropy_temperature=temp, max_steps=1)
    assert RolloutSpec.from_config(args).entropy_temperature == temp
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, seed=2), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    # exact: no soft step gives 0 / units = 0.0
    assert (log["soft_ratio"] > 0.5) == soft and (log["soft_ratio"] == 0) != soft


@needs_data
def test_entropy_temperature_works_in_tarpo_eval(tiny, tmp_path, capsys):
    from tarpo.cli import main as cli

    ratios = {}
    for temp in ("1e-05", "100"):
        out = tmp_path / temp
        assert cli(["eval", "--model", tiny[0], "--mode", "entropy", "--tasks", "gsm8k", "--data-dir", DATA,
                    "--limit", "2", "--n", "2", "--max-new-tokens", "8", "--entropy-temperature", temp,
                    "--out", str(out)]) == 0
        res = json.loads((out / "gsm8k.results.json").read_text())
        assert res["settings"]["entropy_temperature"] == float(temp)
        ratios[temp] = res["metrics"]["soft_ratio"]
    assert ratios["1e-05"] == 0 and ratios["100"] > 0.5  # exact: no soft step gives 0 / units = 0.0
    assert cli(["eval", "--model", tiny[0], "--mode", "entropy", "--tasks", "gsm8k", "--entropy-temperature", "0",
                "--out", str(tmp_path / "bad")]) == 2
    assert "--entropy-temperature 0.0: must be > 0" in capsys.readouterr().err


def test_the_documented_soft_input_example_trains_as_written(tokenizer, tmp_path, monkeypatch):
    """docs/algorithm.md §3's smallest soft input, added as the docs say (its row, its class, a routing rule): the
    decode step feeds it, the rollout records it, the training forward rebuilds it and a trainer step trains."""
    import ast
    import re

    from tarpo import algorithms
    from tarpo.engine import soft_input

    doc = open(f"{ROOT}/docs/algorithm.md").read()
    code = re.search(r"\*\*What a soft step feeds\*\*.*?```python\n(.*?)```", doc, flags=re.S).group(1)
    rows, definition = code.split("# tarpo/engine/soft_input.py")
    scope = {**vars(algorithms), **vars(soft_input), "torch": torch}
    row, rule = (eval(compile(ast.Expression(s.value.elts[0]), "docs", "eval"), scope)
                 for s in ast.parse(rows).body)
    monkeypatch.setitem(algorithms.SOFT_INPUTS, row.name, row)
    monkeypatch.setitem(algorithms.ROUTINGS, rule.name, rule)
    monkeypatch.setitem(soft_input.CLASSES, row.name, None)  # put back as it was after the test
    exec(definition, scope)
    uniform = soft_input.soft_input_class(row.name)()

    model = tiny_causal_lm(tokenizer, seed=2)
    backbone = BiasedBackbone(model, torch.zeros(model.config.vocab_size))
    enc = encode_prompts(tokenizer, ["what is 2+3?", "hi"])
    spec = RolloutSpec(max_new_tokens=12, temperature=0.8, soft_top_k=5, routing=rule.name)
    torch.manual_seed(0)
    out = hybrid_generate(policy_of(backbone, tokenizer, soft_input=uniform), enc.input_ids, enc.attention_mask, spec)
    soft = out.is_soft
    # exact: the recorded weights are the fp32 constant 1/k the class wrote, copied where soft
    assert soft.any() and torch.equal(out.soft_weights[soft], torch.full((int(soft.sum()), 5), 0.2))
    with torch.no_grad():  # the training forward rebuilds the fed inputs: the rollout's log-probs again
        scores = score_rollout(backbone, None, None, out, ScoreSettings(temperature=0.8, chunk_size=7,
                                                                        use_router=False, with_reference=False),
                               soft_input=uniform)
    torch.testing.assert_close(scores.logp_tok[out.completion_mask], out.logp[out.completion_mask], atol=1e-4, rtol=0)
    trainer = TarpoTrainer(model=model, reward_funcs=letter_reward, processing_class=tokenizer,
                           args=make_args(tmp_path, routing=rule.name, max_steps=1), train_dataset=make_dataset())
    assert type(trainer.soft_input).__name__ == "UniformTopK"
    trainer.train()
    assert trainer.state.log_history[0]["soft_ratio"] > 0
