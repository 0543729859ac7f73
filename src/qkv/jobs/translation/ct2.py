"""Translate with CTranslate2: ``qkv translate --engine ctranslate2``.

``CTranslate2Translator`` is a ``Translator`` whose id-level decoding runs in CTranslate2;
tokenizing, batching of lines, detokenizing and scoring are Translator's own. The model comes
from an export folder (``qkv export``), from a run's ``ctranslate2/`` export, or is converted
from the run's weights into a temporary folder when the run has no export.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from qkv import checkpoint as ckpt
from qkv.config import ModelConfig
from qkv.data import BOS_ID, PAD_ID, SubwordTokenizer
from qkv.errors import InputError
from qkv.jobs.translation.export import (
    RUN_EXPORT,
    TOKENIZER,
    export_ctranslate2,
    read_export,
    require_ctranslate2,
)
from qkv.jobs.translation.predict import DecodeOptions, Translator
from qkv.model import Transformer
from qkv.precision import cpu_features
from qkv.viz.attention import RunAttention

# The tests' trained translator lost 5-6 BLEU in int8 against float32 on an AVX2-only CPU, the
# same with CTranslate2's generic ISA or without MKL (within 0.5 on CPUs with AVX-512).
INT8_WITHOUT_AVX512 = (
    "int8 on a CPU without AVX-512 can cost several BLEU against float32 here; "
    "--compute-type float32 keeps the exported model's quality"
)


def int8_kernels_exact() -> bool:
    """Whether CTranslate2 runs int8 on this CPU with AVX-512, where it stays near float32."""
    return "avx512f" in cpu_features()[1]


class CTranslate2Translator(Translator):
    """A translator decoding with ``ctranslate2.Translator`` on the CPU.

    Outputs follow qkv's decoder: greedy for beam 1, the same length penalty, the same
    per-sentence length limit (ratio x source length + add, counting </s>), <s> and <pad>
    never produced, and an empty output allowed.
    """

    def __init__(
        self,
        folder: str | Path,
        tokenizer: SubwordTokenizer,
        config: ModelConfig,
        options: DecodeOptions | None = None,
        settings: Any = None,
        keep: tempfile.TemporaryDirectory | None = None,
    ) -> None:
        ctranslate2 = require_ctranslate2()
        self.folder = Path(folder)
        self.tokenizer = tokenizer
        self.config = config
        self.options = options or DecodeOptions(engine="ctranslate2")
        self.settings = settings
        self._keep = keep  # a temporary conversion lives as long as the translator
        self.vocabulary = tokenizer.token_strings(range(tokenizer.vocab_size))
        self.ids = {token: i for i, token in enumerate(self.vocabulary)}
        try:
            self.engine = ctranslate2.Translator(
                str(self.folder),
                device="cpu",
                compute_type=self.options.compute_type,
                intra_threads=torch.get_num_threads(),
            )
        except (RuntimeError, ValueError) as error:
            raise InputError(
                f"{self.folder}: CTranslate2 cannot load this model ({error})"
            ) from None
        if self.engine.compute_type.startswith("int8") and not int8_kernels_exact():
            print(f"qkv: {INT8_WITHOUT_AVX512}", file=sys.stderr)

    @classmethod
    def from_export(
        cls, folder: str | Path, options: DecodeOptions | None = None, settings: Any = None
    ) -> CTranslate2Translator:
        """The export written by ``qkv export`` (or ``export_ctranslate2``) in ``folder``."""
        from qkv.jobs.translation import TranslationSettings

        info = read_export(folder)
        if info is None:
            raise InputError(f"{folder}: no CTranslate2 export here; make one with `qkv export`")
        try:
            config = ModelConfig.from_dict(info["model"])
        except (KeyError, TypeError, ValueError) as error:
            raise InputError(f"{folder}: the export names no usable model ({error})") from None
        if settings is None:
            settings = TranslationSettings.from_dict(info.get("settings") or {})
        tokenizer = SubwordTokenizer.load(Path(folder) / TOKENIZER)
        return cls(folder, tokenizer, config, options, settings)

    @classmethod
    def from_model(
        cls,
        model: Transformer,
        tokenizer: SubwordTokenizer,
        options: DecodeOptions | None = None,
        settings: Any = None,
    ) -> CTranslate2Translator:
        """Convert ``model`` into a temporary folder (float32) and translate with that."""
        require_ctranslate2()
        print(
            "qkv: the run has no CTranslate2 export (make one with `qkv export`); "
            "converting it for this session",
            file=sys.stderr,
        )
        keep = tempfile.TemporaryDirectory(prefix="qkv-ctranslate2-")
        export_ctranslate2(
            model,
            tokenizer,
            keep.name,
            force=True,
            settings=settings.to_dict() if settings is not None else None,
        )
        return cls(keep.name, tokenizer, model.config, options, settings, keep=keep)

    @property
    def max_positions(self) -> int:
        return self.config.max_len

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def limit(self, source_length: int) -> int:
        """Most output tokens, </s> counted: as ``qkv.decoding.max_lengths``."""
        o = self.options
        limit = math.floor(source_length * o.max_len_ratio) + o.max_len_add
        return max(0, min(limit, self.config.max_len - 1))

    def translate_ids(self, sources: list[list[int]]) -> list[list[int]]:
        """Output ids per source (each ending in </s>, as ``encode_sources`` gives them).

        CTranslate2 has one length limit per call, so sources are grouped by their limit;
        within a call it sorts and batches by tokens itself.
        """
        o = self.options
        groups: dict[int, list[int]] = {}
        for i, source in enumerate(sources):
            groups.setdefault(self.limit(len(source)), []).append(i)
        results: list[list[int]] = [[] for _ in sources]
        forbidden = [[self.vocabulary[BOS_ID]], [self.vocabulary[PAD_ID]]]
        for limit, indices in groups.items():
            if limit == 0:
                continue
            # The model appends </s> itself (add_source_eos), so it is left off here.
            batch = [self.tokenizer.token_strings(sources[i][:-1]) for i in indices]
            outputs = self.engine.translate_batch(
                batch,
                beam_size=o.beam_size,
                length_penalty=o.length_penalty,
                max_decoding_length=limit,
                min_decoding_length=0,
                max_input_length=0,
                suppress_sequences=forbidden,
                max_batch_size=o.max_tokens,
                batch_type="tokens",
            )
            for i, output in zip(indices, outputs, strict=True):
                results[i] = [self.ids[token] for token in output.hypotheses[0]]
        return results

    def attention(self, text: str) -> RunAttention:
        raise InputError(
            "attention pictures need the PyTorch model; use --engine qkv with the run folder"
        )


def load_export(folder: Path, options: DecodeOptions) -> CTranslate2Translator | None:
    """The CTranslate2 translator of ``folder`` (an export, or a run with ``ctranslate2/``).

    None when the options ask for qkv's own decoder, or when a run folder has no export, or
    one older than its weights: then the run's model is loaded (and converted at load time).
    """
    exported = read_export(folder)
    if options.engine != "ctranslate2":
        if exported is not None:
            raise InputError(
                f"{folder}: a CTranslate2 export; translate it with --engine ctranslate2"
            )
        return None
    if exported is not None:
        return CTranslate2Translator.from_export(folder, options)
    run_export = folder / RUN_EXPORT
    if read_export(run_export) is None:
        return None
    weights = folder / ckpt.WEIGHTS
    if weights.is_file() and weights.stat().st_mtime > (run_export / "model.bin").stat().st_mtime:
        print(f"qkv: {run_export} is older than the run's weights; ignoring it", file=sys.stderr)
        return None
    return CTranslate2Translator.from_export(run_export, options)
