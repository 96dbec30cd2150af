import torch

from tarpo.training.scoring import full_token_kl, token_logprobs


def _setup():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(3, 5, 8, requires_grad=True)
    targets = torch.randint(0, 50, (3, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    return head, hidden, targets, mask


def test_chunked_logprobs_equal_direct_values_and_gradients():
    head, hidden, targets, mask = _setup()
    direct = torch.log_softmax(head(hidden) / 0.5, -1).gather(-1, targets[..., None]).squeeze(-1)
    direct = torch.where(mask, direct, torch.zeros_like(direct))
    g_direct = torch.autograd.grad(direct.sum(), hidden)[0]
    for chunk in (1, 3, 100):
        out = token_logprobs(head, hidden, targets, mask, 0.5, chunk)
        torch.testing.assert_close(out, direct)
        torch.testing.assert_close(torch.autograd.grad(out.sum(), hidden)[0], g_direct)


def test_chunked_full_kl_equals_direct_sum():
    head, hidden, _, mask = _setup()
    ref_hidden = hidden.detach() + 0.1 * torch.randn_like(hidden)
    logp = torch.log_softmax(head(hidden) / 0.5, -1)
    logq = torch.log_softmax(head(ref_hidden) / 0.5, -1)
    direct = (logp.exp() * (logp - logq)).sum(-1) * mask
    out = full_token_kl(head, hidden, ref_hidden, mask, 0.5, 4)
    torch.testing.assert_close(out, direct)
    assert (out[mask] > 0).all()
    g = torch.autograd.grad(out.sum(), hidden)[0]
    torch.testing.assert_close(g, torch.autograd.grad(direct.sum(), hidden)[0])
