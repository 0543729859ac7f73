"""Dropout: the packed mask keeps each element with the asked rate, like F.dropout."""

import pytest
import torch
import torch.nn.functional as F

from qkv.config import ModelConfig
from qkv.dropout import LEVELS, Dropout, dropped_levels, packed_dropout, packed_keep_mask
from qkv.model import Transformer


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9])
def test_packed_mask_keeps_each_element_at_the_asked_rate(p):
    torch.manual_seed(0)
    mask = packed_keep_mask((1000, 1000), p)
    assert mask.dtype == torch.bool and mask.shape == (1000, 1000)
    # binomial sd of the rate over 1e6 elements is below 0.0005
    assert mask.float().mean().item() == pytest.approx(1 - p, abs=0.003)
    # every lane of the 64-bit words is uniform, the top one included
    lanes = mask.flatten()[: 4 * 250_000].view(-1, 4).float().mean(0)
    torch.testing.assert_close(lanes, torch.full((4,), 1 - p), atol=0.006, rtol=0)


def test_packed_dropout_agrees_with_the_reference_in_mean_and_spread():
    torch.manual_seed(1)
    x = torch.randn(500, 1000)
    packed, reference = packed_dropout(x, 0.3), F.dropout(x, 0.3, True)
    for out in (packed, reference):
        kept = out != 0
        assert kept.float().mean().item() == pytest.approx(0.7, abs=0.005)
        # kept elements are scaled by 1 / keep rate
        torch.testing.assert_close(out[kept], x[kept] / 0.7, rtol=1e-4, atol=1e-5)
    assert packed.mean().item() == pytest.approx(reference.mean().item(), abs=0.01)
    assert packed.std().item() == pytest.approx(reference.std().item(), rel=0.01)


def test_packed_scale_is_exactly_the_inverse_of_the_rounded_keep_rate():
    x = torch.ones(64, 64)
    out = packed_dropout(x, 0.2)
    kept = LEVELS - dropped_levels(0.2)
    scale = torch.tensor(LEVELS / kept, dtype=torch.float32).item()
    assert set(out.unique().tolist()) == {0.0, scale}


def test_masks_follow_the_seed_and_gradients_follow_the_mask():
    torch.manual_seed(3)
    first = packed_keep_mask((7, 9), 0.5)
    torch.manual_seed(3)
    assert torch.equal(packed_keep_mask((7, 9), 0.5), first)
    x = torch.randn(33, 17, requires_grad=True)
    out = packed_dropout(x, 0.25)
    out.sum().backward()
    torch.testing.assert_close(x.grad, (out != 0).float() / 0.75)


def test_module_is_the_identity_in_eval_mode_and_at_zero():
    x = torch.randn(4, 5)
    for impl in ("auto", "reference", "packed"):
        assert torch.equal(Dropout(0.5, impl).eval()(x), x)
        assert torch.equal(Dropout(0.0, impl).train()(x), x)
    with pytest.raises(ValueError, match="dropout impl"):
        Dropout(0.1, "fast")
    with pytest.raises(ValueError, match="dropout_impl"):
        ModelConfig.preset("tiny", dropout_impl="fast")


def test_model_uses_the_configured_dropout_and_keeps_its_weights():
    config = ModelConfig.preset("tiny", dropout=0.2, dropout_impl="reference")
    packed = Transformer(ModelConfig.preset("tiny", dropout=0.2, dropout_impl="packed"))
    reference = Transformer(config)
    assert packed.state_dict().keys() == reference.state_dict().keys()
    impls = {m.impl for m in packed.modules() if isinstance(m, Dropout)}
    assert impls == {"packed"}
    src = torch.randint(1, 64, (2, 6))
    tgt = torch.randint(1, 64, (2, 5))
    packed.load_state_dict(reference.state_dict())
    packed.eval(), reference.eval()
    torch.testing.assert_close(packed(src, tgt), reference(src, tgt))


def test_auto_draws_packed_masks_on_the_cpu_and_uses_f_dropout_elsewhere(monkeypatch):
    x = torch.randn(40, 50)
    torch.manual_seed(5)
    expected = packed_dropout(x, 0.3)
    torch.manual_seed(5)
    assert torch.equal(Dropout(0.3, "auto").train()(x), expected)
    assert ModelConfig.preset("tiny").dropout_impl == "auto"
    # on another device (meta stands in for one) auto leaves the mask to F.dropout
    calls = []
    monkeypatch.setattr("qkv.dropout.packed_dropout", lambda x, p: calls.append(p) or x)
    Dropout(0.3, "auto").train()(torch.empty(4, 4, device="meta"))
    assert calls == []
    Dropout(0.3, "auto").train()(x)
    assert calls == [0.3]
