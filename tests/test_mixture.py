import torch

from tarpo.engine.mixture import build_inputs_embeds, soft_topk
from tarpo.engine.soft_input import TOP_K_MIXTURE


def test_soft_topk_matches_hand_computation():
    scaled = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    ids, w = soft_topk(scaled, 2)
    assert ids.tolist() == [[1, 2]]
    e3, e2 = torch.exp(torch.tensor(3.0)), torch.exp(torch.tensor(2.0))
    torch.testing.assert_close(w, torch.stack([e3, e2])[None] / (e3 + e2))
    assert w.dtype == torch.float32


def test_weights_sum_to_one_and_mixture_is_hand_weighted_sum():
    torch.manual_seed(0)
    E = torch.randn(50, 8)
    scaled = torch.randn(3, 50)
    ids, w = soft_topk(scaled, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(3))
    tokens = torch.tensor([4, 7, 9])
    is_soft = torch.tensor([True, False, True])
    out = build_inputs_embeds(E, tokens, is_soft, TOP_K_MIXTURE, dict(soft_ids=ids, soft_weights=w))
    for r in range(3):
        expected = sum(w[r, i] * E[ids[r, i]] for i in range(5)) if is_soft[r] else E[tokens[r]]
        torch.testing.assert_close(out[r], expected)


def test_step_and_batch_shapes_rebuild_identical_embeddings():
    """The rollout calls it per step ([B]), the trainer per batch ([B, T]): bitwise equal."""
    torch.manual_seed(1)
    E = torch.randn(40, 16, dtype=torch.bfloat16)
    B, T, k = 3, 6, 4
    ids, w = soft_topk(torch.randn(B, T, 40), k)
    tokens = torch.randint(0, 40, (B, T))
    is_soft = torch.rand(B, T) < 0.5
    batch = build_inputs_embeds(E, tokens, is_soft, TOP_K_MIXTURE, dict(soft_ids=ids, soft_weights=w), chunk_size=3)
    for t in range(T):
        step = build_inputs_embeds(E, tokens[:, t], is_soft[:, t], TOP_K_MIXTURE,
                                   dict(soft_ids=ids[:, t], soft_weights=w[:, t]))
        # exact: elementwise products and a per-row sum over k (no matmul): the point of topk_mixture
        assert torch.equal(step, batch[:, t])
    assert batch.dtype == torch.bfloat16
