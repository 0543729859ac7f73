"""Treebanks in CoNLL-U, and tagged words as model inputs.

``read_conllu`` reads the words of each sentence with their UPOS or XPOS tags, and with
``aux`` the other columns a tagger may learn alongside (``AUX_COLUMNS``). A
``WordEncoder`` turns words into subword ids (each word on its own) and character ids;
``collate`` pads those into one ``TaggingBatch``.

Legend: B batch, S subwords, W words, U distinct words of a batch, C characters of a word.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import conllu
import numpy as np
import torch
from torch import Tensor

from qkv import checkpoint as ckpt
from qkv.data import PAD_ID, UNK_ID, SubwordTokenizer, read_lines
from qkv.errors import InputError, where

TAGSETS = {"upos": 3, "xpos": 4}  # column index (0-based) of the tag in a CoNLL-U token line
# Columns learned by extra heads while training (``--aux-tags``): language-specific tags,
# morphological features and the dependency relation to the head word.
AUX_COLUMNS = {**TAGSETS, "feats": 5, "deprel": 7}
_TOKEN_ID = re.compile(r"\d+|\d+-\d+|\d+\.\d+")
TOKENIZER, CHARS = "tokenizer.json", "chars.json"
IGNORE = -100  # target of subwords that are not a word's first: cross_entropy skips them
CHAR_PAD, CHAR_UNK, WORD_START, WORD_END = 0, 1, 2, 3
MAX_WORD_CHARS = 24  # longer words keep their first 10 and last 14 characters
MAX_WORD_SUBWORDS = 16  # only the first subword is labelled; the rest add context
# Words of raw text as English treebanks split them: punctuation apart, and the clitics n't
# and 's apart from their word ("don't" -> do n't, "Kim's" -> Kim 's).
_RAW_WORD = re.compile(r"\w+(?=n't\b)|n't\b|'\w+|\w+(?:[-.]\w+)*|[^\w\s]", re.IGNORECASE)


@dataclasses.dataclass
class TaggedSentence:
    """Words of one sentence with their gold tags and the file lines they came from.

    ``aux`` holds, for each column read with ``read_conllu(aux=...)``, that column's value of
    each word (``_`` where it is empty).
    """

    words: list[str]
    tags: list[str]
    lines: list[int]
    aux: dict[str, list[str]] = dataclasses.field(default_factory=dict)


def split_words(text: str) -> list[str]:
    """The words of one line of raw text (unlabeled text for pretraining)."""
    return _RAW_WORD.findall(text)


def read_conllu(
    path: str | Path | None,
    tagset: str = "upos",
    option: str = "--train",
    aux: Sequence[str] = (),
) -> list[TaggedSentence]:
    """Read the words (plain integer ids) and their UPOS or XPOS tags from a CoNLL-U file.

    Multiword-token ranges (``1-2``) and empty nodes (``1.1``) are skipped. The lines are
    checked here, since the ``conllu`` library accepts some malformed ones.

    Args:
        path: the CoNLL-U file (UTF-8).
        tagset: ``"upos"`` (column 4) or ``"xpos"`` (column 5).
        option: the option that named ``path``, for the error when it is missing.
        aux: names of ``AUX_COLUMNS`` whose values go to ``TaggedSentence.aux``.
    """
    if path is None:
        raise InputError(f"{option} is missing: give a CoNLL-U file")
    if tagset not in TAGSETS:
        raise InputError(f"tagset {tagset!r} is not one of {sorted(TAGSETS)}")
    for name in aux:
        if name not in AUX_COLUMNS:
            raise InputError(f"column {name!r} is not one of {', '.join(AUX_COLUMNS)}")
    column = TAGSETS[tagset]
    sentences: list[TaggedSentence] = []
    block: list[str] = []
    numbers: list[int] = []
    rows: list[list[str]] = []  # the tab-separated fields of each token line
    for number, line in enumerate([*read_lines(path), ""], start=1):
        if line.strip():
            if not line.startswith("#"):
                _check_token_line(line, path, number, column, tagset)
                numbers.append(number)
                rows.append(line.split("\t"))
            block.append(line)
            continue
        if numbers:
            tokens = conllu.parse("\n".join(block) + "\n\n")[0]
            sentence = TaggedSentence([], [], [], {name: [] for name in aux})
            for token, line_number, fields in zip(tokens, numbers, rows, strict=True):
                if isinstance(token["id"], int):
                    sentence.words.append(token["form"])
                    sentence.tags.append(token[tagset])
                    sentence.lines.append(line_number)
                    for name in aux:
                        sentence.aux[name].append(fields[AUX_COLUMNS[name]].strip() or "_")
            sentences.append(sentence)
        block, numbers, rows = [], [], []
    if not sentences:
        raise InputError(f"{where(path)}: holds no CoNLL-U token lines; is it a CoNLL-U file?")
    return sentences


def _check_token_line(line: str, path: str | Path, number: int, column: int, tagset: str) -> None:
    fields = line.split("\t")
    if len(fields) != 10:
        raise InputError(
            f"{where(path, number)}: a CoNLL-U token line needs 10 tab-separated columns but "
            f"this one has {len(fields)}; separate the columns with single tabs."
        )
    if not _TOKEN_ID.fullmatch(fields[0]):
        raise InputError(
            f"{where(path, number)}: token id {fields[0]!r} is not a number, a range like 1-2 "
            "or an empty node like 1.1."
        )
    if "-" not in fields[0] and "." not in fields[0]:
        if not fields[1].strip():
            raise InputError(f"{where(path, number)}: the word form (column 2) is empty.")
        if fields[column] in ("", "_"):
            raise InputError(
                f"{where(path, number)}: word {fields[1]!r} has no {tagset.upper()} tag "
                f"(column {column + 1} is {fields[column]!r}); tag it or choose the other --tagset."
            )


# ---------------------------------------------------------------- words -> model inputs


@dataclasses.dataclass
class Example:
    """One sentence (or a piece of a long one) as model inputs.

    Attributes:
        ids: (S,) subword ids of all words, in order.
        word_index: (S,) the word each subword belongs to.
        targets: (S,) the word's label id at its first subword, ``IGNORE`` elsewhere.
        chars: (W,) character ids of each word, with word start and end marks.
        aux: (S,) for each extra column learned alongside, its label ids laid out as
            ``targets``.
    """

    ids: list[int]
    word_index: list[int]
    targets: list[int]
    chars: list[list[int]]
    aux: dict[str, list[int]] = dataclasses.field(default_factory=dict)


def align_first_subwords(
    subwords: Sequence[Sequence[int]], labels: Sequence[int] | None = None
) -> tuple[list[int], list[int], list[int]]:
    """Flatten per-word subwords and put each word's label on its first subword.

    Args:
        subwords: the subword ids of each word (a word with none gets ``<unk>``).
        labels: one label id per word, or None (all targets ``IGNORE``).

    Returns:
        (ids, word_index, targets), each with one entry per subword.
    """
    ids: list[int] = []
    word_index: list[int] = []
    targets: list[int] = []
    for w, pieces in enumerate(subwords):
        pieces = list(pieces[:MAX_WORD_SUBWORDS]) or [UNK_ID]
        ids += pieces
        word_index += [w] * len(pieces)
        targets += [IGNORE if labels is None else labels[w]] + [IGNORE] * (len(pieces) - 1)
    return ids, word_index, targets


class WordEncoder:
    """Words -> subword ids (``SubwordTokenizer``) and character ids, as ``Example`` pieces."""

    def __init__(self, tokenizer: SubwordTokenizer, chars: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.chars = list(chars)
        self.char_ids = {c: i + 4 for i, c in enumerate(self.chars)}  # after the 4 reserved ids
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def train(cls, sentences: Sequence[Sequence[str]], vocab_size: int) -> WordEncoder:
        """Learn BPE subwords on the sentences and keep characters seen at least twice."""
        tokenizer = SubwordTokenizer.train((" ".join(s) for s in sentences), vocab_size)
        counts = Counter(c for s in sentences for w in s for c in w)
        return cls(tokenizer, sorted(c for c, n in counts.items() if n >= 2))

    @property
    def n_chars(self) -> int:
        return len(self.chars) + 4

    def subwords(self, words: Sequence[str]) -> list[list[int]]:
        """Subword ids of each word on its own, so that no subword spans two words."""
        new = sorted({w for w in words if w not in self._cache})
        if new:
            self._cache.update(zip(new, self.tokenizer.encode_batch(new), strict=True))
        return [self._cache[w] for w in words]

    def word_chars(self, word: str) -> list[int]:
        if len(word) > MAX_WORD_CHARS:
            word = word[:10] + word[-(MAX_WORD_CHARS - 10) :]
        return [WORD_START, *(self.char_ids.get(c, CHAR_UNK) for c in word), WORD_END]

    def examples(
        self,
        words: Sequence[str],
        labels: Sequence[int] | None,
        max_len: int,
        aux: dict[str, Sequence[int]] | None = None,
    ) -> list[Example]:
        """The sentence as one ``Example``, or as consecutive pieces of at most ``max_len``.

        ``aux`` gives label ids of each word for the extra heads (``Example.aux``).
        """
        pieces = [p[:MAX_WORD_SUBWORDS] or [UNK_ID] for p in self.subwords(words)]
        bounds, start, size = [], 0, 0
        for w, p in enumerate(pieces):
            if size + len(p) > max_len and w > start:
                bounds.append((start, w))
                start, size = w, 0
            size += len(p)
        bounds.append((start, len(words)))
        out = []
        for start, end in bounds:
            if end == start:
                continue
            part = None if labels is None else labels[start:end]
            ids, word_index, targets = align_first_subwords(pieces[start:end], part)
            chars = [self.word_chars(w) for w in words[start:end]]
            extra = {
                name: align_first_subwords(pieces[start:end], values[start:end])[2][:max_len]
                for name, values in (aux or {}).items()
            }
            out.append(
                Example(ids[:max_len], word_index[:max_len], targets[:max_len], chars, extra)
            )
        return out

    def save(self, run_dir: Path) -> None:
        self.tokenizer.save(run_dir / TOKENIZER)
        ckpt.write_json(run_dir / CHARS, {"chars": self.chars})

    @classmethod
    def load(cls, run_dir: Path) -> WordEncoder:
        tokenizer = SubwordTokenizer.load(run_dir / TOKENIZER)
        try:
            chars = json.loads((run_dir / CHARS).read_text(encoding="utf-8"))["chars"]
        except (OSError, ValueError, KeyError) as error:
            raise InputError(f"{run_dir / CHARS}: not a qkv character list ({error})") from None
        return cls(tokenizer, chars)


@dataclasses.dataclass
class TaggingBatch:
    """Padded ``Example``s, each distinct word's characters once.

    Attributes:
        src: (B, S) subword ids, right-padded with ``<pad>``.
        word_index: (B, S) the row of ``chars`` that holds each subword's word.
        targets: (B, S) label ids at first subwords, ``IGNORE`` elsewhere.
        chars: (U, C) character ids of the U distinct words of the batch.
        n_labels: labelled words (the loss is per word).
        aux_targets: (B, S) for each extra column, laid out as ``targets``.
        word_counts: (U,) how often each distinct word's spelling occurs in the training
            words (``collate(..., counts=...)``), or None.
    """

    src: Tensor
    word_index: Tensor
    targets: Tensor
    chars: Tensor
    n_labels: int
    aux_targets: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    word_counts: Tensor | None = None


def _pad(rows: Sequence[Sequence[int]], value: int) -> Tensor:
    """Right-pad int lists into a 2-D long tensor in one vectorised step."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    out = np.full((len(rows), int(lengths.max(initial=0))), value, dtype=np.int64)
    out[np.arange(out.shape[1]) < lengths[:, None]] = np.fromiter(
        itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum())
    )
    return torch.from_numpy(out)


def spelling_counts(examples: Sequence[Example]) -> Counter[tuple[int, ...]]:
    """How often each spelling (a word's character ids) occurs in the examples."""
    return Counter(tuple(c) for e in examples for c in e.chars)


def collate(
    examples: Sequence[Example], counts: Mapping[tuple[int, ...], int] | None = None
) -> TaggingBatch:
    """Pad examples into one batch; a word that recurs ("the", ",") is spelled out once.

    With ``counts`` (``spelling_counts`` of the training examples) the batch carries each
    distinct word's count, 0 for a word the training examples lack.
    """
    rows: dict[tuple[int, ...], int] = {}
    word_index = []
    for e in examples:
        local = [rows.setdefault(tuple(c), len(rows)) for c in e.chars]
        word_index.append([local[w] for w in e.word_index])
    targets = _pad([e.targets for e in examples], IGNORE)  # (B, S)
    return TaggingBatch(
        src=_pad([e.ids for e in examples], PAD_ID),
        word_index=_pad(word_index, 0),
        targets=targets,
        chars=_pad(list(rows), CHAR_PAD),  # (U, C)
        n_labels=int((targets != IGNORE).sum()),
        aux_targets={
            name: _pad([e.aux[name] for e in examples], IGNORE) for name in examples[0].aux
        }
        if examples
        else {},
        word_counts=None
        if counts is None
        else torch.tensor([counts.get(r, 0) for r in rows], dtype=torch.float32),  # (U,)
    )
