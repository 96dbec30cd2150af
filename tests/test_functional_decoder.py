"""The compiled engine's decoder (tarpo.engine.functional_decoder, over tarpo.engine.decoder_tensors' weights)
against transformers' forward of the same model: prefill of a left-padded batch, then one position at a time
through the static cache, fp32."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tarpo.engine import decoder_tensors as dt, functional_decoder as fd
from tarpo.engine.backbone import positions_from_mask
from tarpo.models.tiny import tiny_causal_lm

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL_LINEAR = ATTENTION + ["gate_proj", "up_proj", "down_proj"]
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64, "rope_theta": 500000.0}


def model_of(tokenizer, case):
    arch, tied, targets = case
    model = tiny_causal_lm(tokenizer, arch, seed=3, tie_word_embeddings=tied)
    if arch == "llama":  # Llama-3.1's rope scaling (a short original length, so that it matters at these positions)
        model.config.rope_parameters = dict(LLAMA3)
        model = type(model)(model.config).eval()
    torch.manual_seed(4)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)).eval()


CASES = [("qwen2", True, ATTENTION), ("qwen2", False, ALL_LINEAR), ("llama", False, ATTENTION),
         ("llama", False, ALL_LINEAR), ("qwen2", True, ["q_proj", "v_proj", "up_proj"])]


@pytest.mark.parametrize("merge", ["all", "attention", "none"])
@pytest.mark.parametrize("case", CASES, ids=["qwen2-tied-qkvo", "qwen2-untied-all", "llama3-qkvo", "llama3-all",
                                             "qwen2-q-v-up"])
def test_prefill_and_cached_steps_equal_transformers_forward(tokenizer, case, merge):
    """At every merge level (TarpoConfig.decode_merge): the LoRA merged into copies of q|k|v and o (and of gate|up
    and down), or applied as an adapter. fp32: the merged weights round once more than PEFT's ``W x + s B (A x)``."""
    model = model_of(tokenizer, case)
    base = model.get_base_model()
    if case[0] == "llama":
        assert base.model.rotary_emb.rope_type == "llama3"
    B, P, T = 3, 9, 6
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, len(tokenizer), (B, P + T), generator=g)
    mask = torch.ones(B, P + T, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    mask[2, :7] = 0
    E = base.get_input_embeddings().weight
    pos = positions_from_mask(mask)
    with torch.no_grad():
        ref = base.model(inputs_embeds=E[ids], attention_mask=mask, position_ids=pos).last_hidden_state
        w = dt.build(model, merge)
        L = P + T + 3  # a cache longer than what is written
        cache = fd.new_cache(w, B, L, E.dtype, "cpu")
        got = [fd.forward(w, E[ids[:, :P]], pos[:, :P], cache, torch.arange(P), fd.prefill_mask(mask[:, :P]), P)]
        cache_mask = torch.cat([mask[:, :P], torch.ones(B, L - P, dtype=torch.long)], dim=1)
        for t in range(T):
            slot = torch.tensor(P + t)
            got.append(fd.forward(w, E[ids[:, P + t:P + t + 1]], pos[:, P + t:P + t + 1], cache, slot.view(1),
                                  fd.decode_mask(cache_mask, slot)))
    got = torch.cat(got, dim=1)
    real = mask.bool()
    torch.testing.assert_close(got[real], ref[real], atol=1e-5, rtol=0)
    head = base.get_output_embeddings()
    torch.testing.assert_close(head(got[real]), head(ref[real]), atol=1e-5, rtol=0)
    layer = w.layers[0]
    # merged: q|k|v one matrix (and gate|up at "all") where the block carries LoRA, none left to apply; o and down
    # merged where they carry it; a block without LoRA keeps the model's own weights, projection by projection
    mlp_lora = bool({"gate_proj", "up_proj", "down_proj"} & set(case[2]))
    merged = [g for g, on in ((layer.qkv, merge != "none"), (layer.gate_up, merge == "all" and mlp_lora)) if on]
    assert all(len(g.projections) == 1 and g.lora == () and len(g.sizes) > 1 for g in merged)
    assert layer.o.lora == () or merge == "none"
    if not mlp_lora:
        own = [m.base_layer.weight if hasattr(m, "base_layer") else m.weight
               for m in (base.model.layers[0].mlp.gate_proj, base.model.layers[0].mlp.up_proj)]
        assert [p.weight.data_ptr() for p in layer.gate_up.projections] == [t.data_ptr() for t in own]
    if merge != "none":
        return
    # none: q, k, v grouped (one LoRA product), gate and up too where both carry LoRA; o and down alone; a group
    # whose projections do not all carry LoRA applies each one's own
    assert (layer.qkv.lora != ()) == ("k_proj" in case[2]) and (layer.gate_up.lora != ()) == (case[2] == ALL_LINEAR)
    if layer.qkv.lora:
        assert layer.qkv.lora[0][1].shape == (sum(layer.qkv.sizes), 3 * 4)  # block-diagonal B, r = 4
    else:
        assert [bool(p.lora) for p in layer.qkv.projections] == [True, False, True]


def test_a_groups_lora_product_equals_each_projections_own():
    """Two projections of one input with different scalings and a B bias on one: the grouped product's outputs
    are each projection's ``W x + b + s (B (A x) + b_B)`` (fp32; only the matmuls' shapes differ)."""
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    p1 = dt.Projection(r(6, 5), r(6), ((r(2, 5), r(6, 2), None, 0.5),))
    p2 = dt.Projection(r(3, 5), None, ((r(3, 5), r(3, 3), r(3), 2.0),))
    x = r(4, 1, 5)
    got = fd._group_linear(x, dt._group(p1, p2))
    for out, p in zip(got, (p1, p2)):
        torch.testing.assert_close(out, fd._linear(x, p), atol=1e-6, rtol=0)


def test_refused_what_it_does_not_compute(tokenizer):
    model = get_peft_model(tiny_causal_lm(tokenizer, "qwen2"), LoraConfig(r=4, target_modules=ATTENTION,
                                                                         lora_dropout=0.1))
    with pytest.raises(ValueError, match="LORA_DROPOUT=0"):
        dt.build(model)


def test_regional_forward_traces_one_layer_once(tokenizer):
    """``regional=True``: under torch.compile each layer is a call of one nested compile region (traced once,
    called per layer); ``regional=False`` unrolls the layers. Both compute the eager forward's numbers."""
    model = model_of(tokenizer, ("llama", False, ALL_LINEAR))
    w = dt.build(model)
    E = model.get_base_model().get_input_embeddings().weight
    B, P = 2, 5
    ids, mask = torch.randint(5, len(tokenizer), (B, P)), torch.ones(B, P, dtype=torch.long)
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        ref = fd.forward(w, E[ids], positions_from_mask(mask), fd.new_cache(w, B, P, E.dtype, "cpu"), torch.arange(P),
                         fd.prefill_mask(mask), P)
        for regional in (True, False):
            graphs.clear()
            torch._dynamo.reset()
            step = torch.compile(lambda c: fd.forward(w, E[ids], positions_from_mask(mask), c, torch.arange(P),
                                                      fd.prefill_mask(mask), P, regional), backend=recording,
                                 fullgraph=True)
            got = step(fd.new_cache(w, B, P, E.dtype, "cpu"))
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
            calls = [n for n in graphs[0].graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
            subgraphs = {n.args[0].target for n in calls}
            assert (len(calls), len(subgraphs)) == ((len(w.layers), 1) if regional else (0, 0))


@pytest.mark.parametrize("targets,expected", [(ATTENTION, {"all": 5, "attention": 5, "none": 11}),
                                              (ALL_LINEAR, {"all": 4, "attention": 9, "none": 15})],
                         ids=["paper-targets", "all-linear"])
def test_the_decode_weights_set_the_matrix_products_of_a_layer(tokenizer, targets, expected):
    """The matrix products one decoder layer of the compiled step launches, counted in the graph dynamo traces:
    merged ("all") q|k|v, o, gate|up, down where they carry LoRA (with the paper's targets gate and up stay two
    products of the model's own weights); "attention" merges q|k|v and o only; "none" adds the base products
    of q, k, v, o, gate, up, down and two an adapter (grouped where projections share an input). The generated
    code keeps these (docs/rollout-engines.md, the measurements of decode weights made for decoding:
    inductor leaves every one to a library mm)."""
    model = model_of(tokenizer, ("qwen2", False, targets))
    E = model.get_base_model().get_input_embeddings().weight
    ids, mask = torch.randint(5, len(tokenizer), (2, 1)), torch.ones(2, 1, dtype=torch.long)
    for merge, per_layer in expected.items():
        w = dt.build(model, merge)
        graphs = []

        def recording(gm, example_inputs):
            graphs.append(gm)
            return gm.forward
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(lambda c: fd.forward(w, E[ids], positions_from_mask(mask), c, torch.arange(1),
                                               fd.prefill_mask(mask), 1), backend=recording, fullgraph=True)(
                fd.new_cache(w, 2, 1, E.dtype, "cpu"))
        products = sum(1 for n in graphs[0].graph.nodes if n.op == "call_function" and n.target in (
            torch._C._nn.linear, torch.nn.functional.linear, torch.matmul))
        assert products == per_layer * len(w.layers), (merge, products)
