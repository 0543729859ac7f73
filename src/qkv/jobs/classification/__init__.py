"""Sentence classification on the encoder alone: one label per text, e.g. its sentiment.

A text becomes subwords, after a ``[CLS]`` token when pooling by it; the encoder's outputs are
pooled into one vector (the ``[CLS]`` position, or the mean over the real tokens) and a linear
layer scores the labels. The encoder first learns the language as a masked language model
on the training and unlabeled text (``--unlabeled``), for ``--pretrain-share`` of the
``--max-time`` budget (or ``--pretrain-steps``/``--pretrain-time``), or starts from an earlier
run's pretrained encoder (``--pretrained``); it is then fine-tuned on the labeled data for
the rest of the budget, the validation texts choosing the best weights.

The defaults are the recipe of ``benchmarks/classification_sst2.py``: a 2-layer encoder of
width 128, pretrained for three quarters of the budget, then fine-tuned with strong dropout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qkv.config import ModelConfig, check_chances, option
from qkv.data import PAD_ID, SubwordTokenizer
from qkv.errors import InputError
from qkv.jobs.base import ENCODER_OPTIONS, Job, JobSettings
from qkv.jobs.classification.data import (
    FORMATS,
    LabeledTexts,
    encode_texts,
    read_labeled,
    read_split,
)
from qkv.jobs.classification.model import POOLINGS, SequenceClassifier
from qkv.jobs.classification.predict import CONFUSION, Classifier, ClassifyOptions
from qkv.jobs.classification.task import ClassificationTask
from qkv.jobs.pretraining import (
    MaskedLanguageModel,
    MaskedLMTask,
    PretrainOptions,
    pretrain_encoder,
    pretrained_config,
    read_texts,
)
from qkv.labels import LABELS, LabelVocab
from qkv.training import TrainConfig

TOKENIZER = "tokenizer.json"
FORMAT_HELP = (
    "auto (by suffix and first line), tsv (label<TAB>text), csv (label,text) or sst2 "
    "(label text); a header row like label<TAB>text is detected"
)


@dataclass
class ClassifierData(JobSettings):
    """Data and vocabulary of a classification run."""

    train: str | None = option(None, "training texts, one labeled text a line", metavar="PATH")
    valid: str | None = option(None, "validation texts, the same way", metavar="PATH")
    label_smoothing: float = option(0.0, "label smoothing of the cross-entropy (0 disables)")
    format: str = option("auto", FORMAT_HELP, choices=FORMATS)
    pooling: str = option(
        "mean",
        "one vector per text: a [CLS] token's output, or the mean or the featurewise maximum "
        "of the token outputs",
        choices=POOLINGS,
    )
    # A vocabulary of 12k subwords covers SST-2 and the unlabeled English with whole words
    # for nearly every frequent word.
    vocab_size: int = option(12000, "subword vocabulary size")
    max_len: int = option(128, "subwords kept per text, [CLS] included; longer texts are cut")
    max_tokens: int = option(1024, "tokens per batch, padding included (batches built by length)")
    # Chance that a subword token is replaced by <unk> while training (regularisation): a few
    # thousand labeled sentences overfit a Transformer within a few epochs without it.
    word_dropout: float = option(
        0.1, "word dropout: chance that a training subword is replaced by <unk>"
    )
    # Lower-casing makes differently cased unlabeled text (news, captions) share the
    # subwords of lower-cased data like SST-2; prediction lower-cases the same way.
    lowercase: bool = option(True, "lower-case every text before the tokenizer")


@dataclass
class ClassifierSettings(PretrainOptions, ClassifierData):
    """Data, vocabulary and pretraining of a classification run."""

    # The masked language model learns from far more text than the labeled data, so most of
    # a short budget goes to it.
    pretrain_share: float = option(
        0.75,
        "share of --max-time spent pretraining when neither --pretrain-steps nor "
        "--pretrain-time is given (0 skips pretraining)",
    )

    @classmethod
    def saved(cls, values: dict[str, Any]) -> ClassifierSettings:
        # A run saved before --lowercase existed was trained on texts as they were.
        return cls.from_dict({"lowercase": False, **values})

    def check(self) -> None:
        super().check()
        if self.vocab_size < 8 or self.max_len < 2 or self.max_tokens < 1:
            raise InputError(
                f"--vocab-size {self.vocab_size}, --max-len {self.max_len} and --max-tokens "
                f"{self.max_tokens} must be positive (a vocabulary of at least 8, 2 subwords)"
            )
        check_chances(self, "word_dropout")
        self.check_pretraining()


@dataclass
class Prepared:
    """What a classification run learns from its training data before the model."""

    tokenizer: SubwordTokenizer
    labels: LabelVocab


class ClassifierJob(Job):
    name = "classifier"
    summary = "one label per text (e.g. sentiment): labeled lines in, a classifier out"
    description = (
        "Train a sentence classifier on the encoder alone. A subword vocabulary is learned "
        "from the training text (and --unlabeled text) and saved in the run; the encoder is "
        "first pretrained as a masked language model on that text, for --pretrain-share of "
        "--max-time (or --pretrain-steps), then fine-tuned for the rest."
    )
    Settings = ClassifierSettings
    PredictOptions = ClassifyOptions
    predict_command = "classify"
    predict_help = "label texts, one a line, with a trained classifier"
    predict_description = (
        "Read texts, one a line, and write label<TAB>probability for each line (an empty line "
        "gives an empty line)."
    )
    model_options = ENCODER_OPTIONS
    preset = "small"
    # Narrow and shallow: on a CPU budget of minutes, more steps beat more width; pre-norm
    # GELU layers train at the pretraining's high learning rate.
    model_defaults = {
        "d_model": 128,
        "n_heads": 4,
        "d_ff": 512,
        "n_encoder_layers": 2,
        "dropout": 0.3,  # a few thousand labeled texts: strong dropout while fine-tuning
        "activation": "gelu",
        "norm_first": True,
    }
    # Frequent validation with patience: fine-tuning overfits within a few epochs, and the
    # average of the last checkpoints is kept when it scores better. Fine-tuning's peak lr
    # 1e-3: SST-2 dev 79.47, 79.70, 79.47% against 78.90, 79.59, 77.52% for 5e-4 (seeds 1-3),
    # test 79.35 +- 0.63% against 78.80 +- 0.86% in benchmarks/classification_sst2.py.
    train_defaults = {
        "max_steps": 20000,
        "eval_every": 50,
        "warmup_steps": 100,
        "lr": 1e-3,
        "weight_decay": 0.1,
        "patience": 8,
        "average_last": 5,
    }

    def read_data(self, settings: ClassifierSettings) -> dict[str, Any]:
        """Train and valid ``LabeledTexts`` and the unlabeled texts; checks the valid labels."""
        train = read_split(settings.train, settings.format, "--train")
        valid = read_split(settings.valid, settings.format, "--valid")
        known = LabelVocab.from_data(train.labels)
        for i, label in enumerate(valid.labels):
            known.id(label, valid.where(i))  # an unknown label is an InputError, on every rank
        unlabeled = [text for path in settings.unlabeled for text in read_texts(path)]
        if settings.lowercase:
            for texts in (train, valid):
                texts.texts = [t.lower() for t in texts.texts]
            unlabeled = [t.lower() for t in unlabeled]
        return {"train": train, "valid": valid, "unlabeled": unlabeled}

    def prepare(self, settings: ClassifierSettings, data: Any, run_dir: Path) -> Prepared:
        """Learn (or take the pretrained run's) tokenizer, learn the labels; save both."""
        if settings.pretrained is not None:
            tokenizer = SubwordTokenizer.load(Path(settings.pretrained) / TOKENIZER)
        else:
            texts = [*data["train"].texts, *data.get("unlabeled", [])]
            tokenizer = SubwordTokenizer.train(texts, settings.vocab_size)
        labels = LabelVocab.from_data(data["train"].labels)
        tokenizer.save(run_dir / TOKENIZER)
        labels.save(run_dir / LABELS)
        return Prepared(tokenizer, labels)

    def load_prepared(self, settings: ClassifierSettings, run_dir: Path) -> Prepared:
        return Prepared(
            SubwordTokenizer.load(run_dir / TOKENIZER), LabelVocab.load(run_dir / LABELS)
        )

    def model_config(
        self, config: ModelConfig, settings: ClassifierSettings, prepared: Prepared
    ) -> ModelConfig:
        """An encoder alone, its vocabulary the tokenizer's and <mask>; or the pretrained one's."""
        if settings.pretrained is not None:
            return pretrained_config(config, settings.pretrained)
        return dataclasses.replace(
            config,
            src_vocab_size=prepared.tokenizer.vocab_size + 1,  # + <mask>
            tgt_vocab_size=prepared.tokenizer.vocab_size + 1,
            n_decoder_layers=0,
            pad_id=PAD_ID,
            max_len=max(config.max_len, settings.max_len),
        )

    def build_model(
        self, config: ModelConfig, settings: ClassifierSettings, prepared: Prepared
    ) -> SequenceClassifier:
        return SequenceClassifier(config, len(prepared.labels), settings.pooling)

    def before_fit(
        self,
        model: SequenceClassifier,
        settings: ClassifierSettings,
        prepared: Prepared,
        data: Any,
        train_config: TrainConfig,
        device: str | torch.device | None = None,
    ) -> dict[str, Any]:
        """Pretrain the encoder on the training and unlabeled texts, or copy ``--pretrained``.

        With ``train_config.max_time``, pretraining takes its budget out of it
        (``qkv.jobs.pretraining.pretrain_encoder``).
        """
        cls = settings.pooling == "cls"

        def encode() -> tuple[list[list[int]], list[list[int]]]:
            texts = [*data["train"].texts, *data.get("unlabeled", [])]
            return (
                encode_texts(prepared.tokenizer, texts, settings.max_len, cls),
                encode_texts(prepared.tokenizer, data["valid"].texts, settings.max_len, cls),
            )

        return pretrain_encoder(
            model.encoder, settings, encode, train_config, settings.max_tokens, device
        )

    def build_task(
        self, settings: ClassifierSettings, prepared: Prepared, data: Any
    ) -> ClassificationTask:
        cls = settings.pooling == "cls"
        splits = []
        for texts in (data["train"], data["valid"]):
            ids = encode_texts(prepared.tokenizer, texts.texts, settings.max_len, cls)
            labels = [
                prepared.labels.id(label, texts.where(i)) for i, label in enumerate(texts.labels)
            ]
            splits.append((ids, labels))
        return ClassificationTask(
            *splits,
            len(prepared.labels),
            settings.max_tokens,
            settings.label_smoothing,
            settings.word_dropout,
        )

    def finish(
        self, predictor: Classifier, settings: ClassifierSettings, data: Any, run_dir: Path
    ) -> dict[str, Any]:
        """The confusion matrix of the validation set, drawn into the run folder."""
        scores = predictor.evaluate(data["valid"], run_dir / CONFUSION)
        return {"confusion_png": scores["confusion_png"]}

    def report(self, summary: dict[str, Any], run_dir: Path) -> str:
        best = summary.get("best_val_accuracy")
        accuracy = f"accuracy {best:.2f}%; " if best is not None else ""
        return f"best validation {accuracy}run folder {run_dir}; confusion matrix in {CONFUSION}"

    def predictor(
        self,
        model: SequenceClassifier,
        settings: ClassifierSettings,
        prepared: Prepared,
        **options: Any,
    ) -> Classifier:
        return Classifier(
            model, prepared.tokenizer, prepared.labels, settings, ClassifyOptions(**options)
        )


JOB = ClassifierJob()

__all__ = [
    "JOB",
    "ClassificationTask",
    "Classifier",
    "ClassifierSettings",
    "ClassifyOptions",
    "LabeledTexts",
    "MaskedLMTask",
    "MaskedLanguageModel",
    "SequenceClassifier",
    "read_labeled",
]
