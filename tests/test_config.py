from dataclasses import dataclass

import pytest

from qkv import ModelConfig, Transformer
from qkv.config import check_chances, option
from qkv.errors import InputError


def test_presets_have_the_documented_sizes():
    small = ModelConfig.preset("small")
    assert (small.d_model, small.n_heads, small.d_ff) == (256, 4, 1024)
    assert (small.n_encoder_layers, small.n_decoder_layers) == (3, 3)
    big = ModelConfig.preset("big")
    assert (big.d_model, big.n_heads, big.d_ff, big.dropout) == (1024, 16, 4096, 0.3)
    assert ModelConfig.preset("tiny", d_model=64).d_model == 64


def test_base_parameter_count_matches_its_layers():
    vocab, D, d_ff, N = 37000, 512, 2048, 6
    config = ModelConfig.preset(
        "base", src_vocab_size=vocab, tgt_vocab_size=vocab, share_embeddings=True, tie_output=True
    )
    model = Transformer(config)
    attention = 4 * (D * D + D)  # W_q, W_k, W_v, W_o with biases
    feed_forward = D * d_ff + d_ff + d_ff * D + D
    norm = 2 * D
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    expected = vocab * D + N * encoder_layer + N * decoder_layer + vocab  # + output bias
    assert expected == 63_119_496  # the paper's "65M" base model
    assert sum(p.numel() for p in model.parameters()) == expected


def test_untied_model_has_three_matrices():
    config = ModelConfig.preset("tiny")
    tied = Transformer(ModelConfig.preset("tiny", share_embeddings=True, tie_output=True))
    untied = Transformer(config)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(untied) - n(tied) == 2 * config.src_vocab_size * config.d_model
    assert tied.output.proj.weight is tied.src_embed.token.weight


@pytest.mark.parametrize(
    "overrides, words",
    [
        (dict(d_model=250, n_heads=8), ["d_model=250", "n_heads=8"]),
        (dict(dropout=1.5), ["dropout=1.5"]),
        (dict(activation="tanh"), ["activation='tanh'"]),
        (dict(positional="rotary"), ["positional='rotary'"]),
        (dict(share_embeddings=True, src_vocab_size=10, tgt_vocab_size=12), ["share_embeddings"]),
        (dict(n_heads=0), ["n_heads=0"]),
        (dict(attention_impl="flash"), ["attention_impl='flash'"]),
    ],
)
def test_bad_values_raise_value_error_naming_them(overrides, words):
    with pytest.raises(ValueError) as error:
        ModelConfig.preset("tiny", **overrides)
    for word in words:
        assert word in str(error.value)


def test_unknown_preset_and_field():
    with pytest.raises(ValueError, match="huge"):
        ModelConfig.preset("huge")
    with pytest.raises(ValueError, match="d_modle"):
        ModelConfig.preset("tiny", d_modle=3)


def test_round_trip_through_dict():
    config = ModelConfig.preset("small", norm_first=True, positional="learned")
    assert ModelConfig.from_dict(config.to_dict()) == config


def test_check_chances_names_the_option_of_the_first_field_outside_0_to_1():
    @dataclass
    class Settings:
        keep: float = option(0.0, "a share")
        renamed: float = option(0.99, "a share", flag="--other-name")

    check_chances(Settings(), "keep", "renamed")
    with pytest.raises(InputError, match=r"^--keep 1.0 must be in \[0, 1\)$"):
        check_chances(Settings(keep=1.0, renamed=-1.0), "keep", "renamed")
    with pytest.raises(InputError, match=r"^--other-name -0.5 must be in"):
        check_chances(Settings(renamed=-0.5), "keep", "renamed")
