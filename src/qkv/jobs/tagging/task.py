"""Part-of-speech tagging: one label per word, read from CoNLL-U, on the encoder-only model.

Each word is split into subwords; the encoder runs over the subwords and the word's label is
read at its FIRST subword (the loss ignores the others). A small character CNN encodes the
whole word and is added to each of its subwords, so that an unseen word still shows its
suffix, capitals and digits where its label is read.

Legend: B batch, S subwords, W words, U distinct words of a batch, C characters of a word,
D model width, E character width, K labels, L layers, H heads.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv import checkpoint as ckpt
from qkv.attention import padding_mask
from qkv.config import ModelConfig
from qkv.data import PAD_ID, UNK_ID, SubwordTokenizer, token_batches
from qkv.distributed import main_process_first
from qkv.errors import InputError
from qkv.labels import LABELS, LabelVocab
from qkv.metrics import confusion, label_scores, plot_confusion
from qkv.model import EncoderModel
from qkv.training import TrainConfig, Trainer
from qkv.treebank import TaggedSentence, read_conllu

TASK = "tagger"
TOKENIZER, CHARS, CONFUSION = "tokenizer.json", "chars.json", "confusion.png"
IGNORE = -100  # target of subwords that are not a word's first: cross_entropy skips them
CHAR_PAD, CHAR_UNK, WORD_START, WORD_END = 0, 1, 2, 3
MAX_WORD_CHARS = 24  # longer words keep their first 10 and last 14 characters
MAX_WORD_SUBWORDS = 16  # only the first subword is labelled; the rest add context


# ---------------------------------------------------------------- words -> model inputs


@dataclasses.dataclass
class Example:
    """One sentence (or a piece of a long one) as model inputs.

    Attributes:
        ids: (S,) subword ids of all words, in order.
        word_index: (S,) the word each subword belongs to.
        targets: (S,) the word's label id at its first subword, ``IGNORE`` elsewhere.
        chars: (W,) character ids of each word, with word start and end marks.
    """

    ids: list[int]
    word_index: list[int]
    targets: list[int]
    chars: list[list[int]]


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
        self, words: Sequence[str], labels: Sequence[int] | None, max_len: int
    ) -> list[Example]:
        """The sentence as one ``Example``, or as consecutive pieces of at most ``max_len``."""
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
            out.append(Example(ids[:max_len], word_index[:max_len], targets[:max_len], chars))
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
    """

    src: Tensor
    word_index: Tensor
    targets: Tensor
    chars: Tensor
    n_labels: int


def _pad(rows: Sequence[Sequence[int]], value: int) -> Tensor:
    """Right-pad int lists into a 2-D long tensor in one vectorised step."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    out = np.full((len(rows), int(lengths.max(initial=0))), value, dtype=np.int64)
    out[np.arange(out.shape[1]) < lengths[:, None]] = np.fromiter(
        itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum())
    )
    return torch.from_numpy(out)


def collate(examples: Sequence[Example]) -> TaggingBatch:
    """Pad examples into one batch; a word that recurs ("the", ",") is spelled out once."""
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
    )


# ---------------------------------------------------------------- the model


class CharEncoder(nn.Module):
    """Characters of each word -> one vector per word: embed, convolve (width 3), max-pool.

    (U, C) character ids of U words -> (U, D).
    """

    def __init__(self, n_chars: int, char_dim: int, d_model: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(n_chars, char_dim, padding_idx=CHAR_PAD)
        self.conv = nn.Conv1d(char_dim, d_model, kernel_size=3, padding=1)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, chars: Tensor) -> Tensor:
        x = self.embed(chars).transpose(1, 2)  # (U, E, C)
        h = F.relu(self.conv(x))  # (U, D, C)
        h = h.masked_fill((chars == CHAR_PAD)[:, None, :], 0.0)  # ReLU >= 0: max ignores pad
        return self.proj(h.amax(dim=-1))  # (U, D)


class TaggerModel(nn.Module):
    """``EncoderModel`` over subwords, each plus its word's character vector; a linear head.

    Args:
        config: the encoder's sizes (``src_vocab_size`` = subword vocabulary).
        n_labels: K, the tags.
        n_chars: character vocabulary of ``WordEncoder`` (0 with ``char_dim=0``).
        char_dim: E, width of the character embeddings; 0 leaves out the character encoder.
        token_dropout: while training, the share of subwords replaced by ``<unk>``, so that
            the model learns to tag words from their characters and context alone.
    """

    def __init__(
        self,
        config: ModelConfig,
        n_labels: int,
        n_chars: int,
        char_dim: int = 64,
        token_dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.config, self.token_dropout = config, token_dropout
        self.body = EncoderModel(config)
        self.chars = CharEncoder(n_chars, char_dim, config.d_model) if char_dim > 0 else None
        self.head = nn.Linear(config.d_model, n_labels)

    def forward(
        self,
        src: Tensor,
        word_index: Tensor,
        chars: Tensor,
        attentions: list[Tensor] | None = None,
    ) -> Tensor:
        """src, word_index (B, S) and chars (U, C) of ``TaggingBatch`` -> logits (B, S, K)."""
        tokens = src
        if self.training and self.token_dropout > 0:
            drop = torch.rand(src.shape, device=src.device) < self.token_dropout
            tokens = src.masked_fill(drop & (src != PAD_ID), UNK_ID)
        embed = self.body.embed
        x = embed.token(tokens) * embed.scale  # (B, S, D)
        if self.chars is not None:
            x = x + self.chars(chars)[word_index].to(x.dtype)  # (U, D) -> (B, S, D)
        x = embed.dropout(embed.position(x))
        h = self.body.encoder(x, padding_mask(src, PAD_ID), attentions)  # (B, S, D)
        return self.head(h)


def predict(
    model: TaggerModel, examples: Sequence[Example], max_tokens: int = 4096
) -> tuple[list[list[int]], float, int]:
    """Label ids at each example's first subwords, and the summed loss over labelled words.

    Returns:
        (predicted label ids per example, one per word; loss sum; labelled words)
    """
    device = next(model.parameters()).device
    results: list[list[int]] = [[] for _ in examples]
    total, count = 0.0, 0
    for b in token_batches([len(e.ids) for e in examples], max_tokens, shuffle=False, seed=0):
        batch = collate([examples[i] for i in b])
        src, targets = batch.src.to(device), batch.targets.to(device)
        logits = model(src, batch.word_index.to(device), batch.chars.to(device)).float()
        if batch.n_labels:
            loss = F.cross_entropy(
                logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum"
            )
            total, count = total + loss.item(), count + batch.n_labels
        best = logits.argmax(-1).cpu()  # (B, S)
        for row, i in enumerate(b):
            first = [
                s
                for s, w in enumerate(examples[i].word_index)
                if s == 0 or examples[i].word_index[s - 1] != w
            ]
            results[i] = best[row, first].tolist()
    return results, total, count


# ---------------------------------------------------------------- training


class TaggingTask:
    """Batches, loss and validation of tagging for the ``Trainer``."""

    name = TASK
    metric = "accuracy"
    metric_names = ("loss", "accuracy", "macro_f1")

    def __init__(
        self,
        encoder: WordEncoder,
        labels: LabelVocab,
        train: Sequence[TaggedSentence],
        valid: Sequence[TaggedSentence],
        config: TrainConfig,
        max_len: int,
    ) -> None:
        self.config, self.labels = config, labels
        self.train = encode_sentences(encoder, labels, train, max_len)
        self.valid = encode_sentences(encoder, labels, valid, max_len)

    def train_batches(self, epoch: int, seed: int) -> list[TaggingBatch]:
        lengths = [len(e.ids) for e in self.train]
        batches = token_batches(lengths, self.config.max_tokens, True, seed, epoch)
        return [collate([self.train[i] for i in b]) for b in batches]

    def loss(self, model: nn.Module, batch: TaggingBatch) -> tuple[Tensor, int]:
        """Label-smoothed cross-entropy per word, read at first subwords only."""
        logits = model(batch.src, batch.word_index, batch.chars)  # (B, S, K)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(),
            batch.targets.flatten(),
            ignore_index=IGNORE,
            label_smoothing=self.config.label_smoothing,
            reduction="sum",
        )
        return loss / max(batch.n_labels, 1), batch.n_labels

    def validate(self, model: nn.Module) -> dict[str, float]:
        predicted, total, count = predict(model, self.valid, self.config.max_tokens)
        gold = [t for e in self.valid for t in e.targets if t != IGNORE]
        flat = [p for row in predicted for p in row]
        return {"loss": total / max(count, 1), **label_scores(gold, flat, len(self.labels))}


def encode_sentences(
    encoder: WordEncoder, labels: LabelVocab, sentences: Sequence[TaggedSentence], max_len: int
) -> list[Example]:
    """Examples of gold-tagged sentences, cut into pieces of at most ``max_len`` subwords."""
    out = []
    for s in sentences:
        out += encoder.examples(s.words, [labels.id(t) for t in s.tags], max_len)
    return out


def train_tagger(
    train_path: str | Path,
    valid_path: str | Path,
    model_config: ModelConfig,
    train_config: TrainConfig,
    tagset: str = "upos",
    vocab_size: int = 4000,
    char_dim: int = 64,
    token_dropout: float = 0.1,
    resume: bool = False,
) -> dict[str, Any]:
    """Train a tagger on CoNLL-U files into ``train_config.out``; return the summary.

    The subword vocabulary, characters and labels come from the training file and are saved
    in the run. At the end the best weights tag the validation file into confusion.png.
    """
    run_dir = Path(train_config.out)
    if resume:  # the run's own settings, whatever was asked now
        config = ckpt.read_run_config(run_dir)
        model_config = ModelConfig.from_dict(config["model"])
        tagset, char_dim, token_dropout = (
            config["tagging"][k] for k in ("tagset", "char_dim", "token_dropout")
        )
    train, valid = read_conllu(train_path, tagset), read_conllu(valid_path, tagset)

    def load_inputs() -> tuple[WordEncoder, LabelVocab]:
        return WordEncoder.load(run_dir), LabelVocab.load(run_dir / LABELS)

    def make_inputs() -> tuple[WordEncoder, LabelVocab]:
        encoder = WordEncoder.train([s.words for s in train], vocab_size)
        # Validation tags too, so that a tag missing from training cannot stop a run.
        labels = LabelVocab.from_data(t for s in [*train, *valid] for t in s.tags)
        run_dir.mkdir(parents=True, exist_ok=True)
        encoder.save(run_dir)
        labels.save(run_dir / LABELS)
        return encoder, labels

    if resume:
        encoder, labels = load_inputs()
    else:  # made once, on rank 0, and read by the other ranks under torchrun
        encoder, labels = main_process_first(make_inputs, then=load_inputs)
        model_config = dataclasses.replace(
            model_config,
            src_vocab_size=encoder.tokenizer.vocab_size,
            tgt_vocab_size=encoder.tokenizer.vocab_size,
            pad_id=PAD_ID,
        )
    task = TaggingTask(encoder, labels, train, valid, train_config, model_config.max_len)
    model = TaggerModel(model_config, len(labels), encoder.n_chars, char_dim, token_dropout)
    settings = {
        "tagset": tagset,
        "vocab_size": encoder.tokenizer.vocab_size,
        "char_dim": char_dim,
        "token_dropout": token_dropout,
        "train": str(train_path),
        "valid": str(valid_path),
    }
    run_config = {"task": TASK, "model": model_config.to_dict(), "tagging": settings}
    trainer = Trainer(task, model, train_config, run_config, resume=resume)
    summary = trainer.fit()
    if trainer.is_main:
        tagger = Tagger(trainer.model, encoder, labels, tagset)
        scores = tagger.evaluate(valid, confusion_png=run_dir / CONFUSION, name=Path(valid_path))
        summary["valid_accuracy"], summary["valid_macro_f1"] = (
            scores["accuracy"],
            scores["macro_f1"],
        )
        ckpt.write_json(run_dir / "summary.json", summary)
    return summary


# ---------------------------------------------------------------- using a trained run


class Tagger:
    """A trained tagging run: ``Tagger.load(run_dir).tag(["The dog barks ."])``."""

    def __init__(
        self, model: TaggerModel, encoder: WordEncoder, labels: LabelVocab, tagset: str = "upos"
    ) -> None:
        self.model, self.encoder, self.labels, self.tagset = model.eval(), encoder, labels, tagset

    @classmethod
    def load(cls, run_dir: str | Path, device: str | torch.device = "cpu") -> Tagger:
        run_dir = Path(run_dir)
        config = ckpt.read_run_config(run_dir)
        if config.get("task") != TASK:
            raise InputError(f"{run_dir}: a {config.get('task')!r} run, not a tagger run")
        settings = config["tagging"]
        encoder, labels = WordEncoder.load(run_dir), LabelVocab.load(run_dir / LABELS)
        model = TaggerModel(
            ModelConfig.from_dict(config["model"]),
            len(labels),
            encoder.n_chars,
            settings["char_dim"],
            settings["token_dropout"],
        )
        ckpt.load_weights(model, run_dir / ckpt.WEIGHTS)
        return cls(model.to(device), encoder, labels, settings["tagset"])

    @staticmethod
    def _words(sentence: str | Sequence[str]) -> list[str]:
        return sentence.split() if isinstance(sentence, str) else list(sentence)

    def _predict(self, sentences: Sequence[Sequence[str]]) -> list[list[int]]:
        """Label ids per word; long sentences are tagged in pieces the positions can hold."""
        examples, owner = [], []
        for i, words in enumerate(sentences):
            pieces = self.encoder.examples(words, None, self.model.config.max_len)
            examples += pieces
            owner += [i] * len(pieces)
        results: list[list[int]] = [[] for _ in sentences]
        with torch.no_grad():
            predicted, _, _ = predict(self.model, examples)
        for i, ids in zip(owner, predicted, strict=True):
            results[i] += ids
        return results

    def tag(self, sentences: Sequence[str | Sequence[str]]) -> list[list[tuple[str, str]]]:
        """(word, tag) pairs per sentence; a string is split on whitespace into words."""
        words = [self._words(s) for s in sentences]
        predicted = self._predict(words)
        return [
            [(w, self.labels.names[t]) for w, t in zip(ws, ts, strict=True)]
            for ws, ts in zip(words, predicted, strict=True)
        ]

    @torch.no_grad()
    def attention_maps(self, sentence: str | Sequence[str]) -> dict[str, Any]:
        """Every layer's and head's attention over the subwords of one sentence, for pictures.

        Returns:
            ``{"tokens": subword strings (S), "encoder": (L, H, S, S), "output": [(word, tag)],
            "word_index": the word of each subword (S)}``
        """
        words = self._words(sentence)
        examples = self.encoder.examples(words, None, self.model.config.max_len)
        if len(examples) != 1:
            raise InputError(
                f"the sentence has {len(words)} words and needs one piece of at most "
                f"max_len={self.model.config.max_len} subwords; pass a shorter one"
            )
        e = examples[0]
        batch = collate([e])
        device = next(self.model.parameters()).device
        attentions: list[Tensor] = []
        self.model(
            batch.src.to(device), batch.word_index.to(device), batch.chars.to(device), attentions
        )
        return {
            "tokens": self.encoder.tokenizer.token_strings(e.ids),
            "encoder": torch.stack(attentions)[:, 0].float().cpu(),  # (L, H, S, S)
            "output": self.tag([words])[0],
            "word_index": e.word_index,
        }

    def evaluate(
        self,
        sentences: Sequence[TaggedSentence],
        confusion_png: Path | None = None,
        name: str | Path = "data",
    ) -> dict[str, Any]:
        """Accuracy and macro-F1 (percent) against gold tags; optionally a confusion PNG.

        A gold tag the run never saw in training counts as a wrong answer (the model cannot
        give it) and gets its own row in the confusion matrix; ``unseen_gold_tags`` counts them.
        """
        names = list(self.labels.names)
        extra = sorted({t for s in sentences for t in s.tags} - set(names))
        index = {n: i for i, n in enumerate(names + extra)}
        gold = [index[t] for s in sentences for t in s.tags]
        predicted = [p for row in self._predict([s.words for s in sentences]) for p in row]
        scores = label_scores(gold, predicted, len(index))
        result: dict[str, Any] = {
            **scores,
            "words": len(gold),
            "sentences": len(sentences),
            "unseen_gold_tags": sum(g >= len(names) for g in gold),
        }
        if confusion_png is not None:
            matrix = confusion(gold, predicted, len(index))
            title = f"{self.tagset.upper()} on {Path(name).name}: {scores['accuracy']:.2f}%"
            result["confusion"] = str(plot_confusion(matrix, names + extra, confusion_png, title))
        return result
