"""Weights from ``torch.nn.Transformer`` and friends, for parity checks against PyTorch's own.

``torch.nn.Transformer`` has no embeddings or output layer, so only the stacks are copied;
a qkv model built by ``transformer_from_torch`` keeps its own input and output parts.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

from qkv.config import ModelConfig
from qkv.model import Decoder, Encoder, EncoderModel, Transformer

# torch.nn.Transformer*Layer parameter name -> qkv layer parameter name.
_ENCODER_LAYER_NAMES = {
    r"self_attn\.in_proj_(weight|bias)": r"self_attn.in_proj.\1",
    r"self_attn\.out_proj\.": r"self_attn.out_proj.",
    r"linear([12])\.": r"feed_forward.linear\1.",
    r"norm1\.": r"self_attn_sublayer.norm.",
    r"norm2\.": r"feed_forward_sublayer.norm.",
}
_DECODER_LAYER_NAMES = {
    **{k: v for k, v in _ENCODER_LAYER_NAMES.items() if not k.startswith("norm")},
    r"multihead_attn\.in_proj_(weight|bias)": r"cross_attn.in_proj.\1",
    r"multihead_attn\.out_proj\.": r"cross_attn.out_proj.",
    r"norm1\.": r"self_attn_sublayer.norm.",
    r"norm2\.": r"cross_attn_sublayer.norm.",
    r"norm3\.": r"feed_forward_sublayer.norm.",
}


def _rename(name: str, table: dict[str, str]) -> str:
    for pattern, replacement in table.items():
        new, n = re.subn("^" + pattern, replacement, name)
        if n:
            return new
    raise KeyError(f"no qkv counterpart for torch parameter {name!r}")


def _copy_stack(target: Encoder | Decoder, source: nn.Module, table: dict[str, str]) -> None:
    if len(target.layers) != len(source.layers):
        raise ValueError(
            f"layer counts differ: qkv {len(target.layers)}, torch {len(source.layers)}"
        )
    if isinstance(target.norm, nn.LayerNorm) != (source.norm is not None):
        raise ValueError(
            "one stack has a final LayerNorm and the other not; set ModelConfig.final_norm to match"
        )
    state = {}
    for name, tensor in source.state_dict().items():
        index, _, rest = (
            name.partition(".")[2].partition(".") if name.startswith("layers.") else ("", "", "")
        )
        if name.startswith("layers."):
            state[f"layers.{index}.{_rename(rest, table)}"] = tensor
        else:  # the stack's final norm
            state[name] = tensor
    missing, unexpected = target.load_state_dict(state, strict=False)
    # Cache buffers are not parameters; everything else must have been filled.
    if unexpected or [k for k in missing if "cache" not in k]:
        raise ValueError(f"weights do not line up: missing {missing}, unexpected {unexpected}")


def load_torch_encoder(target: Encoder | EncoderModel, source: nn.TransformerEncoder) -> None:
    """Copy a ``torch.nn.TransformerEncoder``'s layers (and final norm) into a qkv encoder."""
    target = target.encoder if isinstance(target, EncoderModel) else target
    _copy_stack(target, source, _ENCODER_LAYER_NAMES)


def load_torch_decoder(target: Decoder, source: nn.TransformerDecoder) -> None:
    """Copy a ``torch.nn.TransformerDecoder``'s layers (and final norm) into a qkv decoder."""
    _copy_stack(target, source, _DECODER_LAYER_NAMES)


def load_torch_transformer(target: Transformer, source: nn.Transformer) -> None:
    """Copy both stacks of a ``torch.nn.Transformer`` into a qkv ``Transformer``."""
    load_torch_encoder(target.encoder, source.encoder)
    load_torch_decoder(target.decoder, source.decoder)


def config_from_torch(source: nn.Module, **overrides: Any) -> ModelConfig:
    """The ``ModelConfig`` matching a ``torch.nn.Transformer`` or ``TransformerEncoder``."""
    encoder = source.encoder if isinstance(source, nn.Transformer) else source
    layer = encoder.layers[0]
    decoder_layers = len(source.decoder.layers) if isinstance(source, nn.Transformer) else 0
    values: dict[str, Any] = dict(
        d_model=layer.self_attn.embed_dim,
        n_heads=layer.self_attn.num_heads,
        d_ff=layer.linear1.out_features,
        n_encoder_layers=len(encoder.layers),
        n_decoder_layers=decoder_layers,
        dropout=layer.dropout.p,
        attention_dropout=layer.self_attn.dropout,
        activation="gelu" if getattr(layer, "activation_relu_or_gelu", 1) == 2 else "relu",
        norm_first=layer.norm_first,
        final_norm=encoder.norm is not None,
        layer_norm_eps=layer.norm1.eps,
    )
    return ModelConfig(**{**values, **overrides})


def transformer_from_torch(source: nn.Transformer, **overrides: Any) -> Transformer:
    """A qkv ``Transformer`` with ``source``'s sizes and stack weights (vocabularies as given)."""
    model = Transformer(config_from_torch(source, **overrides))
    load_torch_transformer(model, source)
    return model
