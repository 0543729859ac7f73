import math

import pytest
import torch
from torch.testing import assert_close

from qkv import ModelConfig
from qkv.embeddings import InputEmbedding, PositionalEncoding, sinusoid_table


def test_sinusoid_table_follows_the_formula():
    table = sinusoid_table(50, 16)
    pos, i = 37, 3
    assert_close(table[pos, 2 * i], torch.tensor(math.sin(pos / 10000 ** (2 * i / 16))))
    assert_close(table[pos, 2 * i + 1], torch.tensor(math.cos(pos / 10000 ** (2 * i / 16))))


def test_embeddings_are_scaled_and_positioned():
    config = ModelConfig.preset("tiny", dropout=0.0)
    embed = InputEmbedding(config, config.src_vocab_size)
    tokens = torch.tensor([[3, 4, 5]])
    expected = embed.token(tokens) * math.sqrt(config.d_model) + sinusoid_table(3, config.d_model)
    assert_close(embed(tokens), expected)
    # start_pos shifts the positions (incremental decoding)
    shifted = embed.token(tokens[:, 2:]) * math.sqrt(config.d_model) + embed.position.table[2:3]
    assert_close(embed(tokens[:, 2:], start_pos=2), shifted)


def test_learned_positions_are_parameters():
    config = ModelConfig.preset("tiny", positional="learned")
    position = PositionalEncoding(config)
    assert any(p is position.table for p in position.parameters())
    sinusoidal = PositionalEncoding(ModelConfig.preset("tiny"))
    assert list(sinusoidal.parameters()) == []


def test_too_long_sequence_is_a_clear_error():
    config = ModelConfig.preset("tiny", max_len=4)
    with pytest.raises(ValueError, match="max_len=4"):
        PositionalEncoding(config)(torch.zeros(1, 5, config.d_model))
