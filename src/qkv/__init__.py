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
from qkv.kernel_cache import make_room
from qkv.model import Decoder, Encoder, EncoderModel, OutputLayer, Transformer

make_room()  # before torch computes anything: oneDNN sizes its kernel cache once

# The jobs load their libraries (tokenizers, sacreBLEU, ...) only when first used.
_LAZY = {
    "Translator": "qkv.jobs.translation",
    "TranslationSettings": "qkv.jobs.translation",
    "TrainConfig": "qkv.training",
    "Trainer": "qkv.training",
    "SubwordTokenizer": "qkv.data",
    "read_parallel": "qkv.jobs.translation.data",
    "read_tsv": "qkv.jobs.translation.data",
    "read_hf_dataset": "qkv.jobs.translation.data",
    "InputError": "qkv.errors",
    "Tagger": "qkv.jobs.tagging",
    "TaggerSettings": "qkv.jobs.tagging",
    "Classifier": "qkv.jobs.classification",
    "ClassifierSettings": "qkv.jobs.classification",
    "ImageClassifier": "qkv.jobs.vision",
    "VisionSettings": "qkv.jobs.vision",
    "get_job": "qkv.jobs",
    "load_run": "qkv.jobs",
    "run_job": "qkv.jobs.run",
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
