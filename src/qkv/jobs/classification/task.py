"""Sentence classification on the encoder alone: one label per text, e.g. its sentiment.

A text becomes subwords, after a ``[CLS]`` token when pooling by it; the encoder's outputs are
pooled into one vector (the ``[CLS]`` position, or the mean over the real tokens) and a linear
layer scores the labels. The encoder can first learn the language as a masked language model
on unlabeled text, then be fine-tuned on the labeled data.

The ``[CLS]`` token is the reserved ``<s>`` id, which encoder-only inputs never use otherwise;
the masked language model's ``<mask>`` is one id past the tokenizer's vocabulary, so every
classifier's embedding table has that one extra row and can take pretrained weights as they are.

Legend: B batch, S sequence length, D model width, C labels, V vocabulary size, L layers,
H heads, N texts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv import checkpoint as ckpt
from qkv.attention import padding_mask
from qkv.config import ModelConfig
from qkv.data import (
    BOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    SubwordTokenizer,
    pad_batch,
    token_batches,
)
from qkv.errors import InputError
from qkv.labeled_text import LabeledTexts
from qkv.labels import LABELS, LabelVocab
from qkv.metrics import confusion, label_scores, plot_confusion
from qkv.model import EncoderModel
from qkv.training import TrainConfig, Trainer

TOKENIZER = "tokenizer.json"
CONFUSION = "confusion.png"
PRETRAIN_DIR = "pretrain"
POOLINGS = ("cls", "mean")
CLS_NAME = "[CLS]"  # how the <s> id reads in attention pictures
# A first row whose two fields are such names is a header, in either order.
FIRST_WORD_ID = len(SPECIAL_TOKENS)  # ids below are <pad>, <s>, </s>, <unk>


# ---------------------------------------------------------------- models


def pool(states: Tensor, real: Tensor, pooling: str) -> Tensor:
    """One vector per sequence: (B, S, D) states, (B, S) bool real tokens -> (B, D).

    ``cls`` takes position 0; ``mean`` averages the real positions only.
    """
    if pooling == "cls":
        return states[:, 0]
    weights = real.unsqueeze(-1).to(states.dtype)  # (B, S, 1)
    return (states * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class SequenceClassifier(nn.Module):
    """Encoder, pooling, dropout and a linear layer: token ids (B, S) -> label logits (B, C)."""

    def __init__(self, config: ModelConfig, n_labels: int, pooling: str = "mean") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise InputError(f"--pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        self.config, self.pooling = config, pooling
        self.encoder = EncoderModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.d_model, n_labels)

    def forward(self, src: Tensor, attentions: list[Tensor] | None = None) -> Tensor:
        real = src != self.config.pad_id  # (B, S)
        states = self.encoder(src, padding_mask(src, self.config.pad_id), attentions)  # (B, S, D)
        return self.head(self.dropout(pool(states, real, self.pooling)))  # (B, C)


class MaskedLanguageModel(nn.Module):
    """Encoder and an output layer tied to its token embedding, scoring chosen positions."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = EncoderModel(config)
        self.output = nn.Linear(config.d_model, config.src_vocab_size)
        self.output.weight = self.encoder.embed.token.weight

    def forward(self, src: Tensor, select: Tensor | None = None) -> Tensor:
        """ids (B, S) -> logits (B, S, V), or (M, V) at the M positions where ``select`` is True.

        Scoring only the masked positions saves most of the work: the output layer over the
        vocabulary costs more than the encoder of a small model.
        """
        states = self.encoder(src)  # (B, S, D)
        return self.output(states if select is None else states[select])


def mask_tokens(
    src: Tensor, mask_id: int, prob: float, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Choose ``prob`` of the word tokens to predict: 80% become <mask>, 10% a random word.

    Returns:
        (inputs (B, S), targets (B, S) with -100 where nothing is predicted)
    """
    chosen = (torch.rand(src.shape, generator=generator) < prob).to(src.device)
    chosen &= src >= FIRST_WORD_ID
    how = torch.rand(src.shape, generator=generator).to(src.device)
    random_ids = torch.randint(FIRST_WORD_ID, mask_id, src.shape, generator=generator)
    inputs = torch.where(chosen & (how < 0.8), torch.full_like(src, mask_id), src)
    inputs = torch.where(chosen & (how >= 0.9), random_ids.to(src.device), inputs)
    return inputs, src.masked_fill(~chosen, -100)


# ---------------------------------------------------------------- tasks for the Trainer


def encode_texts(
    tokenizer: SubwordTokenizer, texts: Sequence[str], max_len: int, cls: bool
) -> list[list[int]]:
    """Subword ids of each text, after [CLS] when ``cls``, cut to ``max_len`` positions."""
    out = []
    for ids in tokenizer.encode_batch(list(texts)):
        ids = ids[: max_len - int(cls)] or [UNK_ID]  # a text of no subwords still gets a row
        out.append([BOS_ID, *ids] if cls else ids)
    return out


def batched_logits(model: nn.Module, ids: list[list[int]], max_tokens: int) -> Tensor:
    """The model's outputs for every sequence, in input order, from length-sorted batches."""
    device = next(model.parameters()).device
    rows: list[Tensor | None] = [None] * len(ids)
    for batch in token_batches([len(s) for s in ids], max_tokens, shuffle=False, seed=0):
        logits = model(pad_batch([ids[i] for i in batch], PAD_ID).to(device)).float()
        for i, row in zip(batch, logits, strict=True):
            rows[i] = row
    return torch.stack(rows)  # (N, C)


class ClassificationTask:
    """Batches, loss and validation of sentence classification for the ``Trainer``."""

    name = "classifier"
    metric = "accuracy"
    metric_names = ("loss", "accuracy", "macro_f1")

    def __init__(
        self,
        train: tuple[list[list[int]], list[int]],
        valid: tuple[list[list[int]], list[int]],
        n_labels: int,
        config: TrainConfig,
        word_dropout: float = 0.0,
    ) -> None:
        """``train`` and ``valid`` are (subword ids, label ids) of each text."""
        (self.train_ids, self.train_labels), (self.valid_ids, self.valid_labels) = train, valid
        self.n_labels, self.config, self.word_dropout = n_labels, config, word_dropout

    def train_batches(self, epoch: int, seed: int) -> list[dict[str, Tensor]]:
        lengths = [len(s) for s in self.train_ids]
        batches = token_batches(lengths, self.config.max_tokens, True, seed, epoch)
        return [
            {
                "src": pad_batch([self.train_ids[i] for i in b], PAD_ID),
                "labels": torch.tensor([self.train_labels[i] for i in b]),
            }
            for b in batches
        ]

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, int]:
        """Mean label-smoothed cross-entropy per text; words drop to <unk> at ``word_dropout``."""
        src = batch["src"]
        if self.word_dropout > 0:
            dropped = torch.rand(src.shape, device=src.device) < self.word_dropout
            src = src.masked_fill(dropped & (src >= FIRST_WORD_ID), UNK_ID)
        logits = model(src).float()  # (B, C)
        loss = F.cross_entropy(logits, batch["labels"], label_smoothing=self.config.label_smoothing)
        return loss, int((src != PAD_ID).sum())

    def validate(self, model: nn.Module) -> dict[str, float]:
        logits = batched_logits(model, self.valid_ids, self.config.max_tokens)
        gold = torch.tensor(self.valid_labels)
        loss = F.cross_entropy(logits.cpu(), gold).item()
        scores = label_scores(gold.tolist(), logits.argmax(-1).tolist(), self.n_labels)
        return {"loss": loss, **scores}


class MaskedLMTask:
    """Masked language modelling on unlabeled text, to pretrain the encoder."""

    name = "masked_lm"
    metric = "accuracy"  # of the masked tokens
    metric_names = ("loss", "accuracy")

    def __init__(
        self,
        train_ids: list[list[int]],
        valid_ids: list[list[int]],
        mask_id: int,
        config: TrainConfig,
        mask_prob: float = 0.15,
    ) -> None:
        self.train_ids, self.valid_ids = train_ids, valid_ids
        self.mask_id, self.config, self.mask_prob = mask_id, config, mask_prob

    def train_batches(self, epoch: int, seed: int) -> list[Tensor]:
        lengths = [len(s) for s in self.train_ids]
        batches = token_batches(lengths, self.config.max_tokens, True, seed, epoch)
        return [pad_batch([self.train_ids[i] for i in b], PAD_ID) for b in batches]

    def loss(self, model: nn.Module, batch: Tensor) -> tuple[Tensor, int]:
        """Mean cross-entropy over the masked positions."""
        inputs, targets = mask_tokens(batch, self.mask_id, self.mask_prob)
        chosen = targets != -100  # (B, S)
        logits = model(inputs, chosen).float()  # (M, V)
        loss = F.cross_entropy(logits, targets[chosen], reduction="sum")
        return loss / max(int(chosen.sum()), 1), int((batch != PAD_ID).sum())

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Loss and accuracy on the same masked positions at every validation."""
        generator = torch.Generator().manual_seed(0)
        device = next(model.parameters()).device
        total, right, count = 0.0, 0, 0
        lengths = [len(s) for s in self.valid_ids]
        for b in token_batches(lengths, self.config.max_tokens, shuffle=False, seed=0):
            src = pad_batch([self.valid_ids[i] for i in b], PAD_ID)
            inputs, targets = mask_tokens(src, self.mask_id, self.mask_prob, generator)
            chosen = targets != -100  # (B, S)
            logits = model(inputs.to(device), chosen.to(device)).float().cpu()  # (M, V)
            total += F.cross_entropy(logits, targets[chosen], reduction="sum").item()
            right += int((logits.argmax(-1) == targets[chosen]).sum())
            count += int(chosen.sum())
        return {"loss": total / max(count, 1), "accuracy": 100.0 * right / max(count, 1)}


# ---------------------------------------------------------------- using a trained run


class Classifier:
    """A trained classification run: ``Classifier.load(run_dir).predict(["a fine film"])``."""

    def __init__(
        self,
        model: SequenceClassifier,
        tokenizer: SubwordTokenizer,
        labels: LabelVocab,
        max_len: int,
        max_tokens: int = 4096,
    ) -> None:
        self.model, self.tokenizer, self.labels = model.eval(), tokenizer, labels
        self.max_len, self.max_tokens = max_len, max_tokens

    @classmethod
    def load(cls, run_dir: str | Path, device: str | torch.device = "cpu") -> Classifier:
        run_dir = Path(run_dir)
        config = ckpt.read_run_config(run_dir)
        if config.get("task") != "classifier":
            raise InputError(f"{run_dir}: a {config.get('task')!r} run, not a classifier run")
        labels = LabelVocab.load(run_dir / LABELS)
        options = config["data"]["options"]
        model = SequenceClassifier(
            ModelConfig.from_dict(config["model"]), len(labels), options["pooling"]
        )
        ckpt.load_weights(model, run_dir / ckpt.WEIGHTS)
        tokenizer = SubwordTokenizer.load(run_dir / TOKENIZER)
        return cls(model.to(device), tokenizer, labels, options["max_len"])

    @property
    def uses_cls(self) -> bool:
        return self.model.pooling == "cls"

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return encode_texts(self.tokenizer, texts, self.max_len, self.uses_cls)

    @torch.no_grad()
    def probabilities(self, texts: Sequence[str]) -> Tensor:
        """Softmax over the labels for each text: (N, C), columns in ``labels.names`` order."""
        if not texts:
            return torch.zeros(0, len(self.labels))
        return batched_logits(self.model, self.encode(texts), self.max_tokens).softmax(-1).cpu()

    def predict(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """The most probable label of each text and its probability."""
        best = self.probabilities(texts).max(-1)
        return [
            (self.labels.names[i], p)
            for p, i in zip(best.values.tolist(), best.indices.tolist(), strict=True)
        ]

    @torch.no_grad()
    def attention_maps(self, text: str) -> dict[str, Any]:
        """Every layer's and head's attention over one text, for pictures.

        Returns:
            ``{"tokens": subword strings ([CLS] first when pooling by it),
            "encoder": (L, H, S, S) weights, "output": (label, probability)}``
        """
        ids = self.encode([text])[0]
        device = next(self.model.parameters()).device
        attentions: list[Tensor] = []
        logits = self.model(torch.tensor([ids], device=device), attentions).float()  # (1, C)
        probability, index = logits.softmax(-1)[0].max(-1)
        tokens = self.tokenizer.token_strings(ids)
        if self.uses_cls:
            tokens[0] = CLS_NAME
        return {
            "tokens": tokens,
            "encoder": torch.stack(attentions)[:, 0].float().cpu(),  # (L, H, S, S)
            "output": (self.labels.names[int(index)], float(probability)),
        }

    def evaluate(self, data: LabeledTexts, confusion_png: Path | None = None) -> dict[str, Any]:
        """Accuracy and macro-F1 in percent; a label never seen in training is an InputError.

        Args:
            data: the labeled texts.
            confusion_png: where to draw the confusion matrix, if anywhere.
        """
        gold = [self.labels.id(label, data.where(i)) for i, label in enumerate(data.labels)]
        predicted = self.probabilities(data.texts).argmax(-1).tolist()
        scores: dict[str, Any] = label_scores(gold, predicted, len(self.labels))
        scores["texts"] = len(data)
        if confusion_png is not None:
            matrix = confusion(gold, predicted, len(self.labels))
            title = f"{Path(data.source).name}: accuracy {scores['accuracy']:.1f}%"
            scores["confusion_png"] = str(
                plot_confusion(matrix, self.labels.names, confusion_png, title)
            )
        return scores


# ---------------------------------------------------------------- training


@dataclass
class ClassifierOptions:
    """Settings of a classification run besides the model's and the training loop's."""

    pooling: str = "mean"
    vocab_size: int = 8000
    max_len: int = 256  # subwords per text, [CLS] included; longer texts are cut
    # Chance that a word token is replaced by <unk> while training (regularisation).
    word_dropout: float = 0.0
    mask_prob: float = 0.15  # share of word tokens the masked language model predicts
    # Dropout while pretraining: unlabeled text is plentiful next to the labeled data, so the
    # language model needs less of it than the classifier.
    pretrain_dropout: float = 0.1


def _new_run(
    train: LabeledTexts,
    unlabeled: Sequence[str],
    model_config: ModelConfig,
    options: ClassifierOptions,
    run_dir: Path,
    pretrained: Path | None,
) -> tuple[SubwordTokenizer, LabelVocab, ModelConfig]:
    """Learn (or reuse) the vocabulary, learn the label set, size the model, save both."""
    if pretrained is not None:
        if not (pretrained / PRETRAIN_DIR / ckpt.WEIGHTS).is_file():
            raise InputError(
                f"{pretrained}: holds no pretrained encoder; pass a run trained with pretraining"
            )
        tokenizer = SubwordTokenizer.load(pretrained / TOKENIZER)
        sizes = ckpt.read_run_config(pretrained / PRETRAIN_DIR)["model"]
        regularisation = ("dropout", "attention_dropout")
        model_config = ModelConfig.from_dict(
            {**sizes, **{k: getattr(model_config, k) for k in regularisation}}
        )
    else:
        tokenizer = SubwordTokenizer.train([*train.texts, *unlabeled], options.vocab_size)
        model_config = dataclasses.replace(
            model_config,
            src_vocab_size=tokenizer.vocab_size + 1,  # + <mask>
            tgt_vocab_size=tokenizer.vocab_size + 1,
            n_decoder_layers=0,
            pad_id=PAD_ID,
            max_len=max(model_config.max_len, options.max_len),
        )
    labels = LabelVocab.from_data(train.labels)
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(run_dir / TOKENIZER)
    labels.save(run_dir / LABELS)
    return tokenizer, labels, model_config


def _start_encoder(
    model: SequenceClassifier,
    run_dir: Path,
    texts: list[list[int]],
    valid_ids: list[list[int]],
    pretrain_config: TrainConfig | None,
    pretrained: Path | None,
    options: ClassifierOptions,
) -> dict[str, Any] | None:
    """Pretrain the encoder on ``texts``, or copy an earlier run's; return a pretraining summary."""
    language_model = MaskedLanguageModel(
        dataclasses.replace(model.config, dropout=options.pretrain_dropout)
    )
    summary = None
    if pretrained is not None:
        ckpt.load_weights(language_model, pretrained / PRETRAIN_DIR / ckpt.WEIGHTS)
    elif pretrain_config is not None:
        config = dataclasses.replace(pretrain_config, out=str(run_dir / PRETRAIN_DIR))
        mask_id = model.config.src_vocab_size - 1
        task = MaskedLMTask(texts, valid_ids, mask_id, config, options.mask_prob)
        run_config = {"task": "masked_lm", "model": language_model.config.to_dict()}
        summary = Trainer(task, language_model, config, run_config).fit()
    else:
        return None
    model.encoder.load_state_dict(language_model.encoder.state_dict())
    return summary


def _saved_run(
    run_dir: Path,
) -> tuple[SubwordTokenizer, LabelVocab, ModelConfig, ClassifierOptions]:
    saved = ckpt.read_run_config(run_dir)
    return (
        SubwordTokenizer.load(run_dir / TOKENIZER),
        LabelVocab.load(run_dir / LABELS),
        ModelConfig.from_dict(saved["model"]),
        ClassifierOptions(**saved["data"]["options"]),
    )


def train_classifier(
    train: LabeledTexts,
    valid: LabeledTexts,
    model_config: ModelConfig,
    train_config: TrainConfig,
    options: ClassifierOptions | None = None,
    unlabeled: Sequence[str] = (),
    pretrain_config: TrainConfig | None = None,
    pretrained: str | Path | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Train a tokenizer and a classifier into ``train_config.out``; return the summary.

    Args:
        train, valid: labeled texts; every validation label must occur in training.
        model_config: the encoder's sizes (vocabulary size and max_len are set here).
        train_config: the fine-tuning loop.
        options: pooling, vocabulary size, text length, word dropout.
        unlabeled: more text for the tokenizer and for pretraining.
        pretrain_config: when given, first pretrain the encoder as a masked language model on
            the training and unlabeled texts (its run folder is ``<out>/pretrain``).
        pretrained: instead, start from the tokenizer and pretrained encoder of this earlier
            classifier run (e.g. to train several seeds on one pretraining).
        resume: continue the run in ``train_config.out`` (pretraining is not repeated).

    Returns:
        The Trainer's summary, with ``confusion_png`` (validation set) and ``pretraining``.
    """
    run_dir = Path(train_config.out)
    pretrained = Path(pretrained) if pretrained is not None else None
    if pretrained is not None and pretrain_config is not None:
        raise InputError("give either a pretraining to run or a pretrained run, not both")
    if resume:
        tokenizer, labels, model_config, options = _saved_run(run_dir)
    else:
        options = options or ClassifierOptions()
        tokenizer, labels, model_config = _new_run(
            train, unlabeled, model_config, options, run_dir, pretrained
        )
    cls = options.pooling == "cls"
    train_ids, valid_ids = (
        encode_texts(tokenizer, d.texts, options.max_len, cls) for d in (train, valid)
    )
    valid_labels = [labels.id(label, valid.where(i)) for i, label in enumerate(valid.labels)]
    model = SequenceClassifier(model_config, len(labels), options.pooling)
    pretrain_summary = None
    if not resume:
        unlabeled_ids = encode_texts(tokenizer, unlabeled, options.max_len, cls)
        pretrain_summary = _start_encoder(
            model,
            run_dir,
            train_ids + unlabeled_ids,
            valid_ids,
            pretrain_config,
            pretrained,
            options,
        )
    task = ClassificationTask(
        (train_ids, [labels.id(label, train.where(i)) for i, label in enumerate(train.labels)]),
        (valid_ids, valid_labels),
        len(labels),
        train_config,
        options.word_dropout,
    )
    data = {
        "options": dataclasses.asdict(options),
        "train": train.source,
        "valid": valid.source,
        "unlabeled_texts": len(unlabeled),
        "pretrained": str(pretrained) if pretrained else pretrain_config is not None,
    }
    run_config = {"task": "classifier", "model": model_config.to_dict(), "data": data}
    trainer = Trainer(task, model, train_config, run_config, resume=resume)
    summary = trainer.fit()
    if trainer.is_main:
        classifier = Classifier(model, tokenizer, labels, options.max_len, train_config.max_tokens)
        summary["confusion_png"] = classifier.evaluate(valid, run_dir / CONFUSION)["confusion_png"]
        summary["pretraining"] = pretrain_summary
        ckpt.write_json(run_dir / "summary.json", summary)
    return summary
