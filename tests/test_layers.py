import torch
from torch.testing import assert_close

from qkv import ModelConfig
from qkv.layers import DecoderLayer, EncoderLayer, FeedForward, SublayerConnection


def test_feed_forward_is_position_wise():
    config = ModelConfig.preset("tiny", dropout=0.0)
    ff = FeedForward(config)
    x = torch.randn(2, 5, config.d_model)
    assert_close(ff(x)[:, 3], ff(x[:, 3:4])[:, 0])


def test_sublayer_connection_post_and_pre_norm():
    for norm_first in (False, True):
        config = ModelConfig.preset("tiny", dropout=0.0, norm_first=norm_first)
        block = SublayerConnection(config)
        x = torch.randn(2, 3, config.d_model)
        double = lambda h: 2 * h  # noqa: E731
        expected = x + 2 * block.norm(x) if norm_first else block.norm(3 * x)
        assert_close(block(x, double), expected)


def test_encoder_layer_ignores_padded_keys():
    config = ModelConfig.preset("tiny", dropout=0.0)
    layer = EncoderLayer(config).eval()
    x = torch.randn(1, 4, config.d_model)
    mask = torch.tensor([True, True, True, False])[None, None, None]
    changed = x.clone()
    changed[:, 3] = 100.0
    assert_close(layer(x, mask)[:, :3], layer(changed, mask)[:, :3])


def test_decoder_layer_is_causal():
    config = ModelConfig.preset("tiny", dropout=0.0)
    layer = DecoderLayer(config).eval()
    x, memory = torch.randn(1, 5, config.d_model), torch.randn(1, 6, config.d_model)
    changed = x.clone()
    changed[:, 4] = 100.0
    assert_close(layer(x, memory, None)[:, :4], layer(changed, memory, None)[:, :4])
    self_w, cross_w = [], []
    layer(x, memory, None, None, self_w, cross_w)
    assert self_w[0].shape == (1, config.n_heads, 5, 5)
    assert cross_w[0].shape == (1, config.n_heads, 5, 6)
