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

# The jobs load their libraries (tokenizers, sacreBLEU, ...) only when first used.
_LAZY = {
    "Translator": "qkv.tasks.translation",
    "train_translation": "qkv.tasks.translation",
    "TrainConfig": "qkv.training",
    "Trainer": "qkv.training",
    "SubwordTokenizer": "qkv.data",
    "read_parallel": "qkv.data",
    "read_tsv": "qkv.data",
    "read_hf_dataset": "qkv.data",
    "InputError": "qkv.errors",
    "Tagger": "qkv.tasks.tagging",
    "Classifier": "qkv.tasks.classification",
    "ImageClassifier": "qkv.tasks.vision",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'qkv' has no attribute {name!r}")


__all__ = [
    *_LAZY,
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
