"""Export a trained translator to CTranslate2, the C++ engine deployed for fast CPU translation.

The weights are laid out in CTranslate2's own ``TransformerSpec`` (its Python spec API checks
names and shapes), which writes the folder CTranslate2 loads: ``model.bin``, ``config.json``
and the vocabulary. qkv adds ``tokenizer.json`` and ``qkv-export.json`` (the job, the run it
came from, the quantization, the model and data settings), so the folder translates on its
own, without the run folder.

What has to match qkv exactly: token embeddings times sqrt(d_model), qkv's own position table
(sin and cos interleaved, or the learned table), </s> appended to every source and <s> starting
every target, the packed [W_q; W_k; W_v] projection (whole for self-attention, split into W_q
and [W_k; W_v] for encoder-decoder attention), the layer-norm epsilon, and a final LayerNorm
per stack only when the model has one.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from torch import Tensor, nn

from qkv.data import BOS_ID, EOS_ID, UNK_ID, SubwordTokenizer
from qkv.errors import InputError
from qkv.jobs.base import EXPORT_INFO
from qkv.model import Transformer

TOKENIZER = "tokenizer.json"
# Where `qkv translate --model RUN --engine ctranslate2` looks for an export of the run.
RUN_EXPORT = "ctranslate2"
QUANTIZATIONS = ("float32", "int8", "int8_float32")
# Files of an earlier export that spec.save would not overwrite (the vocabulary files differ
# between a shared and a separate vocabulary).
_CT2_FILES = (
    "model.bin",
    "config.json",
    "shared_vocabulary.json",
    "source_vocabulary.json",
    "target_vocabulary.json",
    EXPORT_INFO,
    TOKENIZER,
)


def require_ctranslate2() -> ModuleType:
    """The ``ctranslate2`` package, or one clear ``InputError`` saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise InputError(
            "the CTranslate2 engine is not installed; run `pip install qkv[ctranslate2]`"
        ) from None
    return ctranslate2


def _array(t: Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _set_linear(spec: Any, weight: Tensor, bias: Tensor | None) -> None:
    spec.weight = _array(weight)  # (out, in), as torch.nn.Linear
    if bias is not None:
        spec.bias = _array(bias)


def _set_layer_norm(spec: Any, norm: nn.LayerNorm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _set_attention(spec: Any, attn: nn.Module, norm: nn.LayerNorm, cross: bool) -> None:
    """qkv's packed in_proj [W_q; W_k; W_v] (3D, D) and out_proj into CTranslate2's linears.

    Self-attention takes the packed matrix whole; encoder-decoder attention wants W_q alone
    (it sees the target) and [W_k; W_v] fused (they see the memory).
    """
    D = attn.d_model
    weight, bias = attn.in_proj.weight, attn.in_proj.bias
    if cross:
        _set_linear(spec.linear[0], weight[:D], bias[:D])
        _set_linear(spec.linear[1], weight[D:], bias[D:])
    else:
        _set_linear(spec.linear[0], weight, bias)
    _set_linear(spec.linear[-1], attn.out_proj.weight, attn.out_proj.bias)
    _set_layer_norm(spec.layer_norm, norm)


def _set_feed_forward(spec: Any, layer: nn.Module) -> None:
    _set_linear(spec.linear_0, layer.feed_forward.linear1.weight, layer.feed_forward.linear1.bias)
    _set_linear(spec.linear_1, layer.feed_forward.linear2.weight, layer.feed_forward.linear2.bias)
    _set_layer_norm(spec.layer_norm, layer.feed_forward_sublayer.norm)


def _set_inputs(spec: Any, embed: nn.Module, max_len: int) -> None:
    """Token embeddings (scaled by sqrt(D) in CTranslate2 too) and qkv's own position table."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(embed.token.weight)
    spec.scale_embeddings = True
    spec.position_encodings.encodings = _array(embed.position.table[:max_len])  # (max_len, D)


def transformer_spec(model: Transformer, tokenizer: SubwordTokenizer) -> Any:
    """CTranslate2's ``TransformerSpec`` holding ``model``'s weights and ``tokenizer``'s vocabulary.

    Raises:
        InputError: for a shape CTranslate2 has no place for (a post-norm model with a final
            LayerNorm).
    """
    require_ctranslate2()
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as ts

    config = model.config
    if config.use_final_norm and not config.norm_first:
        raise InputError(
            "a post-norm model with a final LayerNorm (final_norm=True) has no CTranslate2 "
            "equivalent; CTranslate2 has a final LayerNorm only in pre-norm stacks"
        )
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    spec = ts.TransformerSpec.from_config(
        (config.n_encoder_layers, config.n_decoder_layers),
        config.n_heads,
        pre_norm=config.norm_first,
        no_final_norm=not config.use_final_norm,
        activation=activation[config.activation],
    )
    _set_inputs(spec.encoder, model.src_embed, config.max_len)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.layers, strict=True):
        _set_attention(
            layer_spec.self_attention, layer.self_attn, layer.self_attn_sublayer.norm, False
        )
        _set_feed_forward(layer_spec.ffn, layer)
    _set_inputs(spec.decoder, model.tgt_embed, config.max_len)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.layers, strict=True):
        _set_attention(
            layer_spec.self_attention, layer.self_attn, layer.self_attn_sublayer.norm, False
        )
        _set_attention(layer_spec.attention, layer.cross_attn, layer.cross_attn_sublayer.norm, True)
        _set_feed_forward(layer_spec.ffn, layer)
    if config.use_final_norm:
        _set_layer_norm(spec.encoder.layer_norm, model.encoder.norm)
        _set_layer_norm(spec.decoder.layer_norm, model.decoder.norm)
    _set_linear(spec.decoder.projection, model.output.proj.weight, model.output.proj.bias)

    # The vocabulary is every id's token string in id order; special ids are fixed.
    vocabulary = tokenizer.token_strings(range(tokenizer.vocab_size))
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    spec.config.unk_token = vocabulary[UNK_ID]
    spec.config.bos_token = vocabulary[BOS_ID]
    spec.config.eos_token = vocabulary[EOS_ID]
    spec.config.decoder_start_token = vocabulary[BOS_ID]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True  # qkv appends </s> to every source
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    return spec


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def _prepare_folder(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: is a file; give a folder to export into")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise InputError(f"{out}: the folder is not empty; choose another or add --force")
        for name in _CT2_FILES:
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def export_ctranslate2(
    model: Transformer,
    tokenizer: SubwordTokenizer,
    out: str | Path,
    quantization: str = "float32",
    *,
    source: str | Path | None = None,
    settings: dict[str, Any] | None = None,
    force: bool = False,
) -> Path:
    """Write ``model`` as a self-contained CTranslate2 folder ``out``; returns ``out``.

    Args:
        quantization: how the weights are stored, one of ``QUANTIZATIONS``.
        source: the run folder it came from, recorded in ``qkv-export.json``.
        settings: the run's translation settings (validation data for ``qkv evaluate``).
        force: write into a non-empty ``out`` (an earlier export's files are replaced).
    """
    if quantization not in QUANTIZATIONS:
        raise InputError(
            f"--quantization {quantization!r}: choose one of {', '.join(QUANTIZATIONS)}"
        )
    out = Path(out)
    spec = transformer_spec(model, tokenizer)
    _prepare_folder(out, force)
    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(str(out))
    tokenizer.save(out / TOKENIZER)
    info = {
        "format": "ctranslate2",
        "job": "translation",
        "source_run": str(Path(source).resolve()) if source is not None else None,
        "quantization": quantization,
        "ctranslate2_version": _package_version("ctranslate2"),
        "qkv_version": _package_version("qkv"),
        "model": model.config.to_dict(),
        "settings": settings or {},
    }
    (out / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out


def read_export(folder: str | Path) -> dict[str, Any] | None:
    """``qkv-export.json`` of a CTranslate2 export in ``folder``, or None when there is none."""
    path = Path(folder) / EXPORT_INFO
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: not a readable export description ({error})") from None
    if not isinstance(info, dict) or info.get("format") != "ctranslate2":
        raise InputError(f"{path}: not a CTranslate2 export of qkv; export again with `qkv export`")
    for name in ("model.bin", TOKENIZER):
        if not (Path(folder) / name).is_file():
            raise InputError(f"{folder}: the export has no {name}; export again with `qkv export`")
    return info
