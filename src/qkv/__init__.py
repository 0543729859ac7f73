"""qkv: the Transformer as the classic description lays it out, trainable and usable."""

from qkv.attention import (
    KVCache,
    MultiHeadAttention,
    attention,
    causal_mask,
    padding_mask,
    reference_attention,
)
from qkv.config import ModelConfig
from qkv.interop import load_torch_encoder, load_torch_transformer, transformer_from_torch
from qkv.model import Decoder, Encoder, EncoderModel, OutputLayer, Transformer

__all__ = [
    "Decoder",
    "Encoder",
    "EncoderModel",
    "KVCache",
    "ModelConfig",
    "MultiHeadAttention",
    "OutputLayer",
    "Transformer",
    "attention",
    "causal_mask",
    "load_torch_encoder",
    "load_torch_transformer",
    "padding_mask",
    "reference_attention",
    "transformer_from_torch",
]
