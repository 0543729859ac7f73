"""One configuration dataclass for every qkv model, with the paper's named presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from qkv.errors import InputError

ACTIVATIONS = ("relu", "gelu")
POSITIONALS = ("sinusoidal", "learned")
ATTENTION_IMPLS = ("auto", "sdpa", "reference")
DROPOUT_IMPLS = ("auto", "reference", "packed")


def option(
    default: Any = None,
    help: str = "",
    *,
    choices: tuple[str, ...] | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    cli: bool = True,
) -> Any:
    """A settings field that is also a command-line option, with its help text beside it.

    The command line is generated from these fields (``qkv.cli.options``), so a job shows
    exactly the options its settings have. ``flag`` renames the option (default
    ``--field-name``); ``cli=False`` keeps a field off the command line.
    """
    meta = {"help": help, "choices": choices, "flag": flag, "metavar": metavar, "cli": cli}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def option_flag(f: dataclasses.Field) -> str:
    """The command-line option of settings field ``f``: its ``flag``, else ``--field-name``."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def check_chances(settings: Any, *names: str) -> None:
    """Raise an ``InputError`` naming the option of the first of ``settings``' fields
    ``names`` whose value is not a chance in [0, 1) (label smoothing, dropouts)."""
    fields = {f.name: f for f in dataclasses.fields(settings)}
    for name in names:
        value = getattr(settings, name)
        if not 0 <= value < 1:
            raise InputError(f"{option_flag(fields[name])} {value} must be in [0, 1)")


@dataclass
class ModelConfig:
    """Sizes and switches of a Transformer; passed whole to every module.

    The defaults are the paper's ``base`` model. ``ModelConfig.preset(name, **overrides)``
    gives the named sizes: ``tiny`` (tests), ``small`` (CPU training), ``base`` and ``big``.
    """

    src_vocab_size: int = 32000
    tgt_vocab_size: int = 32000
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    # Dropout on embeddings and on every sublayer output before the residual add (paper, 5.4).
    dropout: float = 0.1
    # Dropout on the attention weights; the paper has none, torch.nn.Transformer reuses `dropout`.
    attention_dropout: float = 0.0
    activation: str = "relu"
    # False: post-norm, LayerNorm(x + Sublayer(x)) as in the paper. True: pre-norm,
    # x + Sublayer(LayerNorm(x)), which trains without warmup tricks on deep stacks.
    norm_first: bool = False
    # A LayerNorm after the last layer of each stack; None means "when norm_first", since a
    # pre-norm stack otherwise ends un-normalised. torch.nn.Transformer always has one.
    final_norm: bool | None = None
    positional: str = "sinusoidal"
    # Longest sequence the positional encoding and the KV cache are sized for.
    max_len: int = 1024
    # One embedding matrix for source and target (needs one joint vocabulary).
    share_embeddings: bool = False
    # The output layer reuses the target embedding matrix (paper, 3.4).
    tie_output: bool = False
    pad_id: int = 0
    layer_norm_eps: float = 1e-5
    # "sdpa": torch's fused scaled_dot_product_attention; "reference": the three steps written
    # out; "auto": per call, whichever measured faster for the shape (see qkv.attention).
    attention_impl: str = "auto"
    # How the masks of ``dropout`` (embeddings, sublayer outputs, feed-forward; not the
    # attention weights) are drawn: "reference" is F.dropout; "packed" draws one 64-bit random
    # word per four elements, its mask about 4x faster on a CPU (see qkv.dropout); "auto":
    # packed on a CPU, F.dropout (one fused kernel) on other devices.
    dropout_impl: str = "auto"

    def __post_init__(self) -> None:
        bad = []
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                bad.append(f"{name}={getattr(self, name)!r} must be a positive integer")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                bad.append(f"{name}={getattr(self, name)!r} must be a non-negative integer")
        if not bad and self.d_model % self.n_heads:
            bad.append(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                bad.append(f"{name}={getattr(self, name)!r} must be in [0, 1)")
        if self.activation not in ACTIVATIONS:
            bad.append(f"activation={self.activation!r} must be one of {ACTIVATIONS}")
        if self.positional not in POSITIONALS:
            bad.append(f"positional={self.positional!r} must be one of {POSITIONALS}")
        if self.attention_impl not in ATTENTION_IMPLS:
            bad.append(f"attention_impl={self.attention_impl!r} must be one of {ATTENTION_IMPLS}")
        if self.dropout_impl not in DROPOUT_IMPLS:
            bad.append(f"dropout_impl={self.dropout_impl!r} must be one of {DROPOUT_IMPLS}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            bad.append(
                f"share_embeddings=True needs one vocabulary, but src_vocab_size="
                f"{self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )
        if not bad and not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            bad.append(f"pad_id={self.pad_id} is outside the vocabulary")
        if self.layer_norm_eps <= 0:
            bad.append(f"layer_norm_eps={self.layer_norm_eps!r} must be positive")
        if bad:
            raise ValueError("invalid ModelConfig: " + "; ".join(bad))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def use_final_norm(self) -> bool:
        return self.norm_first if self.final_norm is None else self.final_norm

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """The named sizes (``tiny``, ``small``, ``base``, ``big``) with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s): {sorted(unknown)}")
        return cls(**{**PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        src_vocab_size=64,
        tgt_vocab_size=64,
        max_len=128,
    ),
    "small": dict(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3),
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6),
    # Paper, table 3: dropout 0.3 for the big English-German model.
    "big": dict(
        d_model=1024, n_heads=16, d_ff=4096, n_encoder_layers=6, n_decoder_layers=6, dropout=0.3
    ),
}
