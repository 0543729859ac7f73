import math

import pytest
import torch
from torch.testing import assert_close

from qkv import ModelConfig, MultiHeadAttention, attention, causal_mask, padding_mask
from qkv.attention import KVCache, reference_attention

B, H, T, S, Dh = 3, 2, 5, 7, 8


def qkv_tensors(tq=T, tk=S):
    return torch.randn(B, H, tq, Dh), torch.randn(B, H, tk, Dh), torch.randn(B, H, tk, Dh)


def test_reference_is_the_three_steps():
    q, k, v = qkv_tensors()
    out, weights = reference_attention(q, k, v)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(Dh)
    expected_weights = torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True)
    assert_close(weights, expected_weights)
    assert_close(weights.sum(-1), torch.ones(B, H, T))
    assert_close(out, torch.einsum("bhqk,bhkd->bhqd", expected_weights, v))


def lengths_mask(lengths, tk=S):
    return (torch.arange(tk)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


@pytest.mark.parametrize("kind", ["none", "padding", "causal", "both"])
def test_fast_path_agrees_with_reference(kind):
    q, k, v = qkv_tensors(T, T)
    mask = lengths_mask([5, 3, 1], T) if kind in ("padding", "both") else None
    causal = kind in ("causal", "both")
    fast, none = attention(q, k, v, mask, is_causal=causal, impl="sdpa")
    ref, weights = attention(q, k, v, mask, is_causal=causal, impl="reference")
    assert none is None and weights is not None
    assert_close(fast, ref)
    if causal:
        assert (weights.triu(1) == 0).all()
    if mask is not None:
        assert (weights[1, :, :, 3:] == 0).all()


def test_fully_masked_rows_give_zeros_not_nan():
    q, k, v = qkv_tensors()
    mask = lengths_mask([7, 0, 2])  # the second sequence has no key at all
    for impl in ("sdpa", "reference"):
        out, _ = attention(q, k, v, mask, impl=impl)
        assert not out.isnan().any()
        assert_close(out[1], torch.zeros(H, T, Dh))
    _, weights = reference_attention(q, k, v, mask)
    assert_close(weights[1], torch.zeros(H, T, S))


def test_causal_mask_with_a_cached_prefix():
    mask = causal_mask(2, 5)[0, 0]
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert torch.equal(causal_mask(4)[0, 0], torch.ones(4, 4, dtype=torch.bool).tril())


def test_padding_mask_true_means_attend():
    tokens = torch.tensor([[5, 6, 0], [7, 0, 0]])
    assert padding_mask(tokens, 0).shape == (2, 1, 1, 3)
    assert padding_mask(tokens, 0)[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]


def test_multi_head_self_and_cross_attention_match_torch():
    config = ModelConfig.preset("tiny", d_model=16, n_heads=4)
    ours = MultiHeadAttention(config).eval()
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    ours.in_proj.weight.data.copy_(theirs.in_proj_weight)
    ours.in_proj.bias.data.copy_(theirs.in_proj_bias)
    ours.out_proj.load_state_dict(theirs.out_proj.state_dict())
    x, memory = torch.randn(2, T, 16), torch.randn(2, S, 16)
    keep = lengths_mask([S, 4], S)
    out, weights = ours(x, memory, mask=keep, need_weights=True)
    expected, expected_weights = theirs(x, memory, memory, key_padding_mask=~keep[:, 0, 0])
    assert_close(out, expected)
    assert_close(weights.mean(1), expected_weights)  # torch averages over heads
    self_out, _ = ours(x)
    assert_close(self_out, theirs(x, x, x, need_weights=False)[0])


def test_kv_cache_grows_and_reorders():
    cache = KVCache(2, H, 6, Dh, torch.float32)
    k1, v1 = torch.randn(2, H, 3, Dh), torch.randn(2, H, 3, Dh)
    k, v = cache.update(k1, v1)
    assert k.shape == (2, H, 3, Dh)
    k2, v2 = torch.randn(2, H, 1, Dh), torch.randn(2, H, 1, Dh)
    k, v = cache.update(k2, v2)
    assert_close(k, torch.cat([k1, k2], 2))
    assert_close(v, torch.cat([v1, v2], 2))
    cache.reorder(torch.tensor([1, 1]))
    assert_close(cache.k[0, :, :4], torch.cat([k1, k2], 2)[1])
    with pytest.raises(ValueError, match="6 positions"):
        cache.update(torch.randn(2, H, 3, Dh), torch.randn(2, H, 3, Dh))
    cache.reset()
    assert cache.length == 0


def test_auto_takes_the_fused_kernel_only_where_it_measured_faster():
    from qkv.attention import SHORT_KEYS, fused_pays

    def qk(q_len, k_len, dtype=torch.float32):
        return torch.zeros(2, 4, q_len, 8, dtype=dtype), torch.zeros(2, 4, k_len, 8, dtype=dtype)

    assert fused_pays(*qk(20, 20))  # fp32 training
    assert not fused_pays(*qk(20, 20, torch.bfloat16))  # bf16 training, short sentences
    assert not fused_pays(*qk(1, 40))  # one query of a cached decoding step
    assert fused_pays(*qk(SHORT_KEYS + 1, SHORT_KEYS + 1, torch.bfloat16))  # long inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_gives_the_same_attention_as_both_paths(dtype):
    q, k, v = (torch.randn(2, 4, 6, 8, dtype=dtype) for _ in range(3))
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    auto, _ = attention(q, k, v, mask, is_causal=True, impl="auto")
    fused, _ = attention(q, k, v, mask, is_causal=True, impl="sdpa")
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
    assert_close(auto, fused, **tolerance)
