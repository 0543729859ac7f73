"""Text data every text job shares: a line reader, a subword tokenizer, token-count batching.

``read_lines`` reads UTF-8 text with one clear error per bad byte, ``SubwordTokenizer`` maps text
to ids, and ``token_batches`` groups examples of similar length into batches of at most
``max_tokens`` padded tokens. The job-specific readers live in each job's ``data`` module.

Legend: B batch, T sequence length.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from qkv.checkpoint import write_text
from qkv.errors import InputError, where

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # index == fixed id
FIRST_WORD_ID = len(SPECIAL_TOKENS)  # ids below are <pad>, <s>, </s>, <unk>

Pair = tuple[str, str]


# ---------------------------------------------------------------- readers


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """Read a UTF-8 text file as lines without their ``\\n`` or ``\\r\\n`` endings.

    Only ``\\n`` ends a line: ``str.splitlines`` would also split on U+2028 or U+0085 inside a
    sentence and break the alignment of parallel files.

    Args:
        path: the file.

    Returns:
        One string per line; a final newline does not add an empty line.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{where(path)}: no such file; check the path.")
    if path.is_dir():
        raise InputError(f"{where(path)}: is a directory; pass a text file with one line each.")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(
            f"{where(path)}: cannot be read ({e.strerror}); check its permissions."
        ) from None
    if not data:
        raise InputError(f"{where(path)}: the file is empty; pass a file with one line each.")
    raw_lines = data.split(b"\n")  # safe on bytes: 0x0A never occurs inside a UTF-8 sequence
    if raw_lines[-1] == b"":
        raw_lines.pop()
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(
                f"{where(path, number)}: byte {e.start + 1} of the line (0x{raw[e.start]:02x}) "
                "is not valid UTF-8; re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)."
            ) from None
        lines.append(line.removesuffix("\r"))
    lines[0] = lines[0].removeprefix("\ufeff")  # a byte-order mark is not part of the sentence
    return lines


# ---------------------------------------------------------------- tokenizer


class SubwordTokenizer:
    """Byte-pair-encoding subwords (Hugging Face ``tokenizers``) with fixed special ids.

    ``<pad>``=0, ``<s>``=1, ``</s>``=2, ``<unk>``=3. Spaces become ``▁`` before splitting
    (Metaspace), so ``decode(encode(s)) == s`` for NFKC-normal text with single spaces.
    Train one tokenizer on source and target text for a joint vocabulary.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        for token_id, token in enumerate(SPECIAL_TOKENS):
            if tokenizer.token_to_id(token) != token_id:
                raise ValueError(f"{token} has id {tokenizer.token_to_id(token)}, not {token_id}")
        self._tokenizer = tokenizer

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2
    ) -> SubwordTokenizer:
        """Learn BPE merges from ``texts`` until the vocabulary has ``vocab_size`` entries.

        Args:
            texts: sentences (any iterable; read once).
            vocab_size: vocabulary size including the four special tokens.
            min_frequency: a pair must occur this often to be merged.
        """
        if vocab_size <= len(SPECIAL_TOKENS):
            raise InputError(
                f"vocab_size={vocab_size} leaves no room beside the {len(SPECIAL_TOKENS)} special "
                "tokens; use a few thousand."
            )
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),  # added first, so they take ids 0..3
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Subword ids of ``text``, without ``<s>`` or ``</s>``."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        """``encode`` for many texts at once, in parallel inside the library."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenized text of ``ids`` (a list or a 1-D tensor); special ids are skipped."""
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def words(self, text: str) -> list[str]:
        """The normalized words of ``text`` that BPE splits, each with its ``▁`` prefix."""
        normalized = self._tokenizer.normalizer.normalize_str(text)
        return [word for word, _ in self._tokenizer.pre_tokenizer.pre_tokenize_str(normalized)]

    def merges(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        """The vocabulary (subword -> id) and the BPE merges (pair -> rank, 0 merged first)."""
        model = json.loads(self._tokenizer.to_str())["model"]
        merges = model["merges"]  # ["a b", ...] in older files, [["a", "b"], ...] in newer
        pairs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
        return dict(model["vocab"]), {pair: rank for rank, pair in enumerate(pairs)}

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """The subword of each id, special tokens included (labels for attention plots)."""
        strings = []
        for i in ids:
            token = self._tokenizer.id_to_token(int(i))
            if token is None:
                raise ValueError(f"id {int(i)} is outside the vocabulary of {self.vocab_size}")
            strings.append(token)
        return strings

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the tokenizer as one JSON file; a crash never leaves a half-written file."""
        write_text(Path(path), self._tokenizer.to_str())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SubwordTokenizer:
        """Read a file written by ``save``."""
        path = Path(path)
        if not path.is_file():
            raise InputError(f"{where(path)}: no such tokenizer file; check the path.")
        try:
            tokenizer = Tokenizer.from_str(path.read_text(encoding="utf-8"))
            return cls(tokenizer)
        except Exception as e:  # the Rust parser raises a bare Exception
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise InputError(
                f"{where(path)}: is not a qkv tokenizer ({reason}); "
                "pass the JSON file written by SubwordTokenizer.save."
            ) from None


class SubwordDropout:
    """BPE-dropout (Provilkov et al., 2020): texts split by the tokenizer's merges, each merge
    left out with probability p at every step, so a word is split anew each epoch.

    With p = 0 the split is the tokenizer's own (``encode_batch``; tested). The words of the
    texts are found once; each call splits every distinct word once, with ``random.Random(seed)``,
    so the same seed gives the same ids.
    """

    def __init__(self, tokenizer: SubwordTokenizer, texts: Sequence[str]) -> None:
        self.vocab, self.ranks = tokenizer.merges()
        index: dict[str, int] = {}
        self.texts = [[index.setdefault(w, len(index)) for w in tokenizer.words(t)] for t in texts]
        self.words = list(index)

    def split(self, word: str, p: float, draw: random.Random) -> list[int]:
        """The ids of ``word``: merge the best-ranked adjacent pair not left out, until none is."""
        pieces = list(word)
        while len(pieces) > 1:
            best, at = None, -1
            for i in range(len(pieces) - 1):
                rank = self.ranks.get((pieces[i], pieces[i + 1]))
                if rank is None or (best is not None and rank >= best):
                    continue
                if p and draw.random() < p:
                    continue
                best, at = rank, i
            if best is None:
                break
            pieces[at : at + 2] = [pieces[at] + pieces[at + 1]]
        return [self.vocab.get(piece, UNK_ID) for piece in pieces]

    def encode(self, p: float, seed: int) -> list[list[int]]:
        """The ids of every text, each distinct word split once with merges left out at p."""
        draw = random.Random(seed)
        splits = [self.split(word, p, draw) for word in self.words]
        return [[i for w in words for i in splits[w]] for words in self.texts]


# ---------------------------------------------------------------- batching


def token_batches(
    lengths: Sequence[int], max_tokens: int, shuffle: bool, seed: int, epoch: int = 0
) -> list[list[int]]:
    """Group example indices into batches of at most ``max_tokens`` padded tokens.

    Examples are sorted by length (ties broken at random when shuffling) and packed greedily,
    so a batch holds similar lengths and little padding; then the order of batches is shuffled.

    Args:
        lengths: tokens per example (e.g. the longer of source and target).
        max_tokens: budget per batch: ``len(batch) * max(lengths in batch) <= max_tokens``;
            an example longer than the budget gets a batch of its own.
        shuffle: randomize tie order and batch order.
        seed, epoch: the same pair gives the same batches; a new epoch gives a new order.

    Returns:
        Batches of indices into ``lengths``; every index appears exactly once.
    """
    if max_tokens < 1:
        raise InputError(f"max_tokens={max_tokens} must be positive; use a few thousand.")
    sizes = np.asarray(lengths, dtype=np.int64).reshape(-1)
    rng = np.random.default_rng(seed * 100003 + epoch) if shuffle else None
    if rng is not None:
        order = np.lexsort((rng.permutation(len(sizes)), sizes))  # last key sorts first
    else:
        order = np.argsort(sizes, kind="stable")
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for index, size in zip(order.tolist(), sizes[order].tolist(), strict=True):
        size = max(size, 1)  # an empty example still takes a row
        if batch and (len(batch) + 1) * max(longest, size) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(index)
        longest = max(longest, size)
    if batch:
        batches.append(batch)
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches)).tolist()]
    return batches


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> torch.Tensor:
    """Right-pad id sequences into a (B, T) long tensor, T the longest sequence."""
    longest = max((len(seq) for seq in sequences), default=0)
    out = torch.full((len(sequences), longest), pad_id, dtype=torch.long)  # (B, T)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return out


def hide_words(ids: torch.Tensor, chance: float) -> torch.Tensor:
    """Word dropout: each subword of ``ids`` (B, T) becomes <unk> with ``chance``, drawn from
    torch's global generator (which checkpoints save, so a resumed run draws the same);
    padding, <s>, </s> and <unk> stay. Returns ``ids`` itself, drawing nothing, at 0."""
    if chance <= 0:
        return ids
    hidden = torch.rand(ids.shape, device=ids.device) < chance  # (B, T)
    return ids.masked_fill(hidden & (ids >= FIRST_WORD_ID), UNK_ID)  # (B, T)
