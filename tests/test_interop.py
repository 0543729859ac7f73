"""Parity with PyTorch's own Transformer: same weights, same outputs, on full tensors."""

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from qkv import EncoderModel, ModelConfig, load_torch_encoder, transformer_from_torch
from qkv.interop import config_from_torch

D, H, F, B, S, T, V = 32, 4, 64, 3, 7, 5, 50


def torch_transformer(norm_first, activation="relu"):
    model = nn.Transformer(
        d_model=D,
        nhead=H,
        num_encoder_layers=2,
        num_decoder_layers=3,
        dim_feedforward=F,
        dropout=0.1,
        activation=activation,
        batch_first=True,
        norm_first=norm_first,
    ).eval()
    # torch's nested-tensor path writes zeros at padded positions; compare full tensors instead
    model.encoder.use_nested_tensor = False
    return model


def causal_mask_torch():
    return torch.ones(T, T, dtype=torch.bool).triu(1)  # torch convention: True = blocked


def inputs():
    lengths = torch.tensor([7, 4, 1])
    src_keep = torch.arange(S)[None, :] < lengths[:, None]  # (B, S) True = real token
    return torch.randn(B, S, D), torch.randn(B, T, D), src_keep


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_whole_transformer_matches_torch(norm_first, activation):
    theirs = torch_transformer(norm_first, activation)
    ours = transformer_from_torch(theirs, src_vocab_size=V, tgt_vocab_size=V).eval()
    assert ours.config.norm_first == norm_first and ours.config.activation == activation
    src, tgt, keep = inputs()
    mask = keep[:, None, None, :]  # qkv convention: (B, 1, 1, S), True = attend
    causal = causal_mask_torch()
    with torch.no_grad():
        expected = theirs(
            src, tgt, tgt_mask=causal, src_key_padding_mask=~keep, memory_key_padding_mask=~keep
        )
        memory = ours.encoder(src, mask)
        assert_close(memory, theirs.encoder(src, src_key_padding_mask=~keep))
        assert_close(ours.decoder(tgt, memory, mask), expected)
        # the whole qkv model on token ids: its input part fed to torch, then its output part
        src_ids = torch.randint(1, V, (B, S)).masked_fill(~keep, 0)
        tgt_ids = torch.randint(1, V, (B, T))
        via_torch = ours.output(
            theirs(
                ours.src_embed(src_ids),
                ours.tgt_embed(tgt_ids),
                tgt_mask=causal,
                src_key_padding_mask=~keep,
                memory_key_padding_mask=~keep,
            )
        )
        assert_close(ours(src_ids, tgt_ids), via_torch)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_alone_matches_torch_with_target_padding(norm_first):
    theirs = torch_transformer(norm_first)
    ours = transformer_from_torch(theirs, src_vocab_size=V, tgt_vocab_size=V).eval()
    memory, tgt, keep = inputs()
    tgt_keep = torch.arange(T)[None, :] < torch.tensor([5, 3, 2])[:, None]
    causal = causal_mask_torch()
    with torch.no_grad():
        expected = theirs.decoder(
            tgt,
            memory,
            tgt_mask=causal,
            tgt_key_padding_mask=~tgt_keep,
            memory_key_padding_mask=~keep,
        )
        actual = ours.decoder(tgt, memory, keep[:, None, None], tgt_keep[:, None, None])
    assert_close(actual, expected)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_model_matches_torch_encoder(norm_first):
    layer = nn.TransformerEncoderLayer(D, H, F, batch_first=True, norm_first=norm_first)
    theirs = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False).eval()
    config = config_from_torch(theirs, src_vocab_size=V, tgt_vocab_size=V)
    assert config.n_encoder_layers == 3 and config.final_norm is False
    ours = EncoderModel(config).eval()
    load_torch_encoder(ours, theirs)
    src, _, keep = inputs()
    with torch.no_grad():
        expected = theirs(src, src_key_padding_mask=~keep)
        assert_close(ours.encoder(src, keep[:, None, None]), expected)
        tokens = torch.randint(1, V, (B, S)).masked_fill(~keep, 0)
        assert_close(ours(tokens), theirs(ours.embed(tokens), src_key_padding_mask=~keep))


def test_mismatched_stacks_are_refused():
    theirs = torch_transformer(False)
    ours = EncoderModel(ModelConfig.preset("tiny", d_model=D, n_encoder_layers=5))
    with pytest.raises(ValueError, match="layer counts differ"):
        load_torch_encoder(ours, theirs.encoder)
