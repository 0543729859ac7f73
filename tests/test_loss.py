"""The loss: the blockwise fused cross-entropy agrees with F.cross_entropy, value and gradient."""

import pytest
import torch
import torch.nn.functional as F

from qkv.loss import smoothed_cross_entropy


def loss_and_grad(logits, target, smoothing, **kwargs):
    x = logits.clone().requires_grad_()
    loss = smoothed_cross_entropy(x, target, smoothing, **kwargs)
    (loss / 7).backward()  # a scale as the trainer's division by the token count
    return loss, x.grad


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_elements", [1, 3 * 97, 1 << 19])  # 1 row, 3 rows, all rows
def test_fused_matches_the_reference(smoothing, dtype, block_elements):
    torch.manual_seed(0)
    logits = (torch.randn(50, 97) * 4).to(dtype)  # 50 rows: blocks of 3 leave a remainder
    target = torch.randint(0, 97, (50,))
    ref_loss, ref_grad = loss_and_grad(logits, target, smoothing, impl="reference")
    loss, grad = loss_and_grad(
        logits, target, smoothing, impl="fused", block_elements=block_elements
    )
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-4)
    # bf16 gradients: both round the same fp32 gradient, at most one bf16 step apart
    tol = {"rtol": 1e-5, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 1e-5}
    torch.testing.assert_close(grad, ref_grad, **tol)


def test_the_formula_by_hand():
    logits = torch.tensor([[1.0, 2.0, 0.0], [0.5, -1.0, 3.0]])
    target = torch.tensor([1, 0])
    s = 0.2
    log_p = logits.log_softmax(-1)
    smoothed = torch.full((2, 3), s / 3)
    smoothed[0, 1] += 1 - s
    smoothed[1, 0] += 1 - s
    expected = -(smoothed * log_p).sum()
    torch.testing.assert_close(smoothed_cross_entropy(logits, target, s), expected)


def test_fp32_logits_are_left_unchanged_and_no_grad_needs_no_gradient():
    logits = torch.randn(10, 20)
    before = logits.clone()
    loss = smoothed_cross_entropy(logits, torch.zeros(10, dtype=torch.long), 0.1)
    assert not loss.requires_grad
    torch.testing.assert_close(logits, before, rtol=0, atol=0)


def test_under_autocast_the_loss_stays_fp32():
    torch.manual_seed(2)
    layer = torch.nn.Linear(16, 300)
    h, target = torch.randn(40, 16), torch.randint(0, 300, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = layer(h)
        assert logits.dtype == torch.bfloat16
        fused = smoothed_cross_entropy(logits, target, 0.1)
        reference = F.cross_entropy(logits.float(), target, label_smoothing=0.1, reduction="sum")
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-4)


def test_unknown_impl_is_refused():
    with pytest.raises(ValueError, match="loss impl 'fast'"):
        smoothed_cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), impl="fast")
