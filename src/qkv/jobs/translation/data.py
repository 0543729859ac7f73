"""Translation data: parallel text readers and teacher-forcing batches.

The readers turn files (or a Hugging Face dataset) into sentence pairs; ``clean_pairs`` drops
the unusable ones; ``make_translation_batch`` pads id sequences into a ``TranslationBatch``.

Legend: B batch, S source length, T target length.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from qkv.data import BOS_ID, EOS_ID, PAD_ID, pad_batch, read_lines
from qkv.errors import InputError, where

Pair = tuple[str, str]


def read_parallel(src_path: str | os.PathLike[str], tgt_path: str | os.PathLike[str]) -> list[Pair]:
    """Read two line-aligned files (line i of one translates line i of the other).

    Returns:
        ``(source, target)`` pairs, one per line.
    """
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise InputError(
            f"{where(src_path)}: has {len(src)} lines but {where(tgt_path)} has {len(tgt)}; "
            "parallel files must hold one sentence per line, line by line aligned."
        )
    return list(zip(src, tgt, strict=True))


def read_tsv(path: str | os.PathLike[str]) -> list[Pair]:
    """Read ``source<TAB>target`` lines.

    Blank lines become ``("", "")`` so that ``clean_pairs`` counts them as skipped.

    Returns:
        ``(source, target)`` pairs, one per line.
    """
    pairs = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            pairs.append(("", ""))
            continue
        tabs = line.count("\t")
        if tabs != 1:
            raise InputError(
                f"{where(path, number)}: expected source<TAB>target but found {tabs} tabs; "
                "put exactly one tab between the source and the target sentence."
            )
        src, tgt = line.split("\t")
        pairs.append((src, tgt))
    return pairs


def read_hf_dataset(
    dataset: Any,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    src_field: str = "src",
    tgt_field: str = "tgt",
) -> list[Pair]:
    """Read sentence pairs from one split of a Hugging Face ``datasets.Dataset``.

    Args:
        dataset: a ``datasets.Dataset`` (one split, e.g. ``load_dataset(...)["train"]``).
        src_lang, tgt_lang: language keys of a ``translation`` column
            (``{"translation": {"de": ..., "en": ...}}``); when given, that layout is read.
        src_field, tgt_field: the two string columns, read when no languages are given.

    Returns:
        ``(source, target)`` pairs; a missing value becomes ``""`` so ``clean_pairs`` drops it.
    """
    try:
        import datasets
    except ImportError:
        raise InputError(
            "reading a Hugging Face dataset needs the datasets package; "
            "install it with `pip install datasets`."
        ) from None
    if not isinstance(dataset, datasets.Dataset):
        raise InputError(
            f"expected a datasets.Dataset but got {type(dataset).__name__}; "
            "pass one split, e.g. dataset['train']."
        )
    columns = list(dataset.column_names)
    if src_lang is not None or tgt_lang is not None:
        if src_lang is None or tgt_lang is None or "translation" not in columns:
            raise InputError(
                f"src_lang={src_lang!r} and tgt_lang={tgt_lang!r} need both languages and a "
                f"'translation' column (columns: {columns}); give both or use src_field/tgt_field."
            )
        pairs = []
        for row, item in enumerate(dataset["translation"]):
            missing = [lang for lang in (src_lang, tgt_lang) if lang not in item]
            if missing:
                raise InputError(
                    f"dataset row {row}: translation has no {missing[0]!r} (it has "
                    f"{sorted(item)}); pick src_lang and tgt_lang among those."
                )
            pairs.append((_text(item[src_lang], row), _text(item[tgt_lang], row)))
        return pairs
    for field in (src_field, tgt_field):
        if field not in columns:
            hint = " or src_lang/tgt_lang" if "translation" in columns else ""
            raise InputError(
                f"dataset has no column {field!r} (columns: {columns}); "
                f"pass src_field and tgt_field{hint}."
            )
    return [
        (_text(src, row), _text(tgt, row))
        for row, (src, tgt) in enumerate(zip(dataset[src_field], dataset[tgt_field], strict=True))
    ]


def _text(value: object, row: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(
            f"dataset row {row}: expected a string but got {type(value).__name__}; "
            "choose text columns for src_field and tgt_field."
        )
    return value


def clean_pairs(
    pairs: Iterable[Pair], max_len: int, count_tokens: Callable[[str], int]
) -> tuple[list[Pair], dict[str, int]]:
    """Drop pairs with an empty side or a side longer than ``max_len`` tokens.

    Args:
        pairs: ``(source, target)`` pairs.
        max_len: most tokens allowed on either side.
        count_tokens: ``text -> number of tokens``, e.g. ``lambda s: len(tokenizer.encode(s))``.

    Returns:
        The kept pairs in their order, and counts ``{"empty": n, "too_long": m, "kept": k}``.
    """
    kept: list[Pair] = []
    counts = {"empty": 0, "too_long": 0, "kept": 0}
    for src, tgt in pairs:
        if not src.strip() or not tgt.strip():
            counts["empty"] += 1
        elif count_tokens(src) > max_len or count_tokens(tgt) > max_len:
            counts["too_long"] += 1
        else:
            kept.append((src, tgt))
    counts["kept"] = len(kept)
    return kept, counts


@dataclass
class TranslationBatch:
    """One training batch: ``tgt_in`` is ``tgt_out`` shifted right by ``<s>`` (teacher forcing).

    Attributes:
        src: (B, S) source ids, each ending in ``</s>``, right-padded with ``<pad>``.
        tgt_in: (B, T) ``<s>`` + target, the decoder input.
        tgt_out: (B, T) target + ``</s>``, what the decoder should predict.
        n_tokens: non-pad tokens in ``tgt_out``, to normalize the loss per token.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_tokens: int

    def to(self, device: torch.device | str) -> TranslationBatch:
        """The same batch with its tensors on ``device``."""
        return TranslationBatch(
            self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.n_tokens
        )


def make_translation_batch(
    src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]]
) -> TranslationBatch:
    """Build a ``TranslationBatch`` from id sequences without special tokens.

    Args:
        src_ids: B source sequences.
        tgt_ids: B target sequences, in the same order.
    """
    if len(src_ids) != len(tgt_ids):
        raise ValueError(f"{len(src_ids)} source sequences but {len(tgt_ids)} target sequences")
    src = pad_batch([[*seq, EOS_ID] for seq in src_ids])  # (B, S)
    tgt_in = pad_batch([[BOS_ID, *seq] for seq in tgt_ids])  # (B, T)
    tgt_out = pad_batch([[*seq, EOS_ID] for seq in tgt_ids])  # (B, T)
    n_tokens = int((tgt_out != PAD_ID).sum())
    return TranslationBatch(src=src, tgt_in=tgt_in, tgt_out=tgt_out, n_tokens=n_tokens)


def read_pairs(
    path: str | os.PathLike[str] | None,
    source_lang: str | None,
    target_lang: str | None,
    option: str = "--train",
) -> list[Pair]:
    """Sentence pairs from a TSV file, or from PATH.SRC and PATH.TGT with the two languages.

    Args:
        path: a ``source<TAB>target`` file, or a prefix such as ``data/train`` whose
            ``data/train.de`` and ``data/train.en`` are line-aligned.
        source_lang, target_lang: the suffixes (``de``, ``en``); None reads ``path`` as TSV.
        option: the option that named ``path``, for error messages.
    """
    if path is None:
        raise InputError(f"{option} is missing: give a TSV file or a prefix with the languages")
    if (source_lang is None) != (target_lang is None):
        raise InputError("give both --source-lang and --target-lang, or neither (TSV data)")
    if source_lang is not None:
        return read_parallel(f"{path}.{source_lang}", f"{path}.{target_lang}")
    if not os.path.isfile(path):
        raise InputError(
            f"{option} {path}: no such file; give a source<TAB>target file, or a prefix "
            "PREFIX with --source-lang SRC --target-lang TGT to read PREFIX.SRC and PREFIX.TGT"
        )
    return read_tsv(path)
