"""Part-of-speech tagging: one label per word, read from CoNLL-U, on the encoder-only model.

The subword vocabulary and the characters are learned from the training words (and the
words of ``--unlabeled`` text), the labels from the training and validation tags; all three
are saved in the run folder. Each word's tag is predicted at its first subword
(``qkv.jobs.tagging.model``). With ``--pretrain-share``, ``--pretrain-steps`` or
``--pretrain-time`` the encoder first learns the words as a masked language model on the
training and unlabeled sentences (``qkv.jobs.pretraining``); with ``--pretrained RUN`` it
starts from the vocabulary and encoder of an earlier run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from qkv.config import ModelConfig, check_chances, option
from qkv.data import PAD_ID
from qkv.errors import InputError
from qkv.jobs.base import ENCODER_OPTIONS, Job, JobSettings
from qkv.jobs.pretraining import (
    PretrainOptions,
    pretrain_encoder,
    pretrained_config,
    read_texts,
)
from qkv.jobs.tagging.data import (
    AUX_COLUMNS,
    IGNORE,
    MAX_WORD_SUBWORDS,
    TAGSETS,
    TaggedSentence,
    WordEncoder,
    align_first_subwords,
    read_conllu,
    split_words,
)
from qkv.jobs.tagging.model import CHAR_DIM, CHAR_WIDTHS, CharEncoder, TaggerModel
from qkv.jobs.tagging.predict import CONFUSION, Tagger, TagOptions
from qkv.jobs.tagging.task import TaggingTask
from qkv.labels import LABELS, LabelVocab
from qkv.training import TrainConfig

DEFAULT_AUX = ("xpos", "deprel")


@dataclass
class TaggerData(JobSettings):
    """Data, vocabulary and word encoder of a tagging run."""

    train: str | None = option(None, "training sentences, CoNLL-U", metavar="PATH")
    valid: str | None = option(None, "validation sentences, CoNLL-U", metavar="PATH")
    tagset: str = option(
        "upos",
        "upos: universal tags (column 4); xpos: language-specific tags (column 5)",
        choices=tuple(TAGSETS),
    )
    # Word dropout 0.2 and a pretraining share of 0.4 (below), with 8,000 subwords: on UD
    # English-EWT dev (20 minutes, the two runs side by side on one thread each) 93.40%
    # against 93.01% for 0.0, 0.6 and 4,000 subwords with seed 1, 93.02% against 92.74% with
    # seed 2, 93.36% against 92.93% with seed 3. Then 16,000 subwords: 94.30% against 93.93%
    # for 8,000 (seed 1; 12,000: 94.24%; all 23,291 that the training and unlabeled words
    # allow: 94.27%), and 94.33% against 94.06% with seed 2; test 94.47% in
    # benchmarks/tagging_ud_ewt.py against 94.63% for the 8,000-subword run (one seed each).
    vocab_size: int = option(16000, "subword vocabulary size")
    max_len: int = option(
        1024, "longest piece in subwords; longer sentences are cut between words into pieces"
    )
    max_tokens: int = option(
        2000, "subwords per training batch, padding included (batches are built by length)"
    )
    char_dim: int = option(
        CHAR_DIM, "width of the character embeddings of the word encoder; 0: subwords only"
    )
    char_widths: list[int] = option(
        list(CHAR_WIDTHS),
        "widths of the word encoder's character convolutions (odd; one convolution each, "
        "repeatable): a window at the word's end sees its last width - 1 characters",
        metavar="N",
    )
    token_dropout: float = option(
        0.1,
        "share of subwords hidden as <unk> while training, so that unseen words are tagged "
        "from characters and context",
    )
    word_dropout: float = option(
        0.2,
        "share of a batch's distinct words whose subwords all become <unk> while training, "
        "as unseen words are missing from the vocabulary",
    )
    rare_word_dropout: float = option(
        0.0,
        "alpha: while training, a word seen c times in --train is also hidden as with "
        "--word-dropout with chance alpha/(alpha+c), so rare words go missing most often "
        "(0 disables)",
        metavar="ALPHA",
    )
    # Extra heads on XPOS and the dependency relations: on UD English-EWT dev (20 minutes,
    # two runs side by side on one thread each) 93.69% against 93.40% without them with seed
    # 1, 93.96% against 93.02% with seed 2, 93.83% against 93.36% with seed 3; the dev loss
    # lower throughout (0.26 against 0.29 at the end). FEATS as a third head: 93.82% (seed 1).
    aux_tags: list[str] = option(
        list(DEFAULT_AUX),
        "another column of --train learned alongside by an extra head while training: "
        f"{', '.join(AUX_COLUMNS)}; repeatable; none: no extra head; with --tagset xpos the "
        "default's xpos becomes upos",
        metavar="COLUMN",
    )
    aux_weight: float = option(0.5, "weight of each --aux-tags head's loss")


@dataclass
class TaggerSettings(PretrainOptions, TaggerData):
    """Data, vocabulary, word encoder and pretraining of a tagging run."""

    # Masked-LM pretraining (then for 60% of --max-time): on UD English-EWT dev (seed 1, 20
    # minutes, the two runs side by side on one thread each, Multi30k's English captions as
    # --unlabeled) 92.92% against 92.41% without it, with the dev loss at 0.28 against 0.33;
    # now 40% of --max-time, with the vocabulary and word dropout above (see
    # ``TaggerData.vocab_size``).
    pretrain_share: float = option(
        0.4,
        "share of --max-time spent pretraining when neither --pretrain-steps nor "
        "--pretrain-time is given (0 skips pretraining)",
    )

    @classmethod
    def saved(cls, values: dict[str, Any]) -> TaggerSettings:
        # A run saved before --aux-tags existed has no extra heads.
        return cls.from_dict({"aux_tags": [], **values})

    def check(self) -> None:
        super().check()
        if self.tagset not in TAGSETS:
            raise InputError(f"--tagset {self.tagset!r} is not one of {', '.join(TAGSETS)}")
        if self.vocab_size < 8:
            raise InputError(f"--vocab-size {self.vocab_size} must be at least 8")
        if self.max_len < 1:
            raise InputError(f"--max-len {self.max_len} must be at least 1")
        if self.max_tokens < 1:
            raise InputError(f"--max-tokens {self.max_tokens} must be at least 1")
        if self.char_dim < 0:
            raise InputError(f"--char-dim {self.char_dim} must be 0 (no characters) or more")
        if not self.char_widths or any(w < 1 or w % 2 == 0 for w in self.char_widths):
            widths = " ".join(map(str, self.char_widths)) or "(none)"
            raise InputError(f"--char-widths {widths}: each width must be odd and positive")
        check_chances(self, "token_dropout", "word_dropout")
        if self.rare_word_dropout < 0:
            raise InputError(f"--rare-word-dropout {self.rare_word_dropout} must be 0 or more")
        for name in self.aux_tags:
            if name not in AUX_COLUMNS or name == self.tagset:
                others = ", ".join(c for c in AUX_COLUMNS if c != self.tagset)
                raise InputError(f"--aux-tags {name} is not one of {others}")
        if len(set(self.aux_tags)) < len(self.aux_tags):
            raise InputError(f"--aux-tags names a column twice: {' '.join(self.aux_tags)}")
        if self.aux_weight < 0:
            raise InputError(f"--aux-weight {self.aux_weight} must be 0 or more")
        self.check_pretraining()


class TaggerInputs(NamedTuple):
    """What a tagging run learns from its data before training (its prepared inputs)."""

    encoder: WordEncoder
    labels: LabelVocab
    aux: dict[str, LabelVocab]  # the extra heads' labels by column


def _aux_labels_path(run_dir: Path, column: str) -> Path:
    return run_dir / f"labels-{column}.json"


class TaggerJob(Job):
    name = "tagger"
    summary = "one label per word: CoNLL-U in, a part-of-speech tagger out"
    description = (
        "Train a part-of-speech tagger on CoNLL-U files. Words are split into subwords "
        "(learned from the training words) and read by their characters too; each word's tag "
        "is predicted at its first subword. The best weights tag --valid into confusion.png "
        "in the run folder."
    )
    Settings = TaggerSettings
    PredictOptions = TagOptions
    predict_command = "tag"
    predict_help = "tag sentences, one a line, with a trained tagger"
    predict_description = (
        "Read sentences, one a line, words split on whitespace, and write `word/TAG ...` "
        "lines (an empty line gives an empty line) or CoNLL-U blocks."
    )
    model_options = ENCODER_OPTIONS
    # Pre-norm layers and dropout 0.2: the treebank is small (200k words) for a model trained
    # from scratch.
    model_defaults = {"norm_first": True, "dropout": 0.2}
    preset = "small"
    # Short warmup and frequent validation, so that a budget of minutes still picks and
    # averages good checkpoints. Peak lr 2e-3 for the tagging phase: dev 94.02% and 93.90%
    # against 93.67% and 93.80% for 1e-3 (seeds 1 and 2), test 94.63% against 94.25% in
    # benchmarks/tagging_ud_ewt.py.
    train_defaults = {
        "max_steps": 20000,
        "eval_every": 200,
        "warmup_steps": 300,
        "lr": 2e-3,
        "average_last": 5,
    }

    def resolve(self, settings: TaggerSettings) -> TaggerSettings:
        """``--aux-tags none`` -> no extra heads; the default's xpos -> upos with
        ``--tagset xpos``."""
        if settings.aux_tags == ["none"]:
            return dataclasses.replace(settings, aux_tags=[])
        if settings.tagset == "xpos" and settings.aux_tags == list(DEFAULT_AUX):
            other = ["upos" if name == "xpos" else name for name in DEFAULT_AUX]
            return dataclasses.replace(settings, aux_tags=other)
        return settings

    def read_data(self, settings: TaggerSettings) -> dict[str, Any]:
        """Train and valid ``TaggedSentence``s; the unlabeled sentences as lists of words."""
        return {
            "train": read_conllu(settings.train, settings.tagset, "--train", settings.aux_tags),
            "valid": read_conllu(settings.valid, settings.tagset, "--valid"),
            "unlabeled": [
                words
                for path in settings.unlabeled
                for words in map(split_words, read_texts(path))
                if words
            ],
        }

    def prepare(self, settings: TaggerSettings, data: Any, run_dir: Path) -> TaggerInputs:
        """Learn (or take the pretrained run's) word encoder, learn the labels; save both."""
        if settings.pretrained is not None:
            encoder = WordEncoder.load(Path(settings.pretrained))
        else:
            sentences = [*(s.words for s in data["train"]), *data.get("unlabeled", [])]
            encoder = WordEncoder.train(sentences, settings.vocab_size)
        # Validation tags too, so that a tag missing from training cannot stop a run.
        labels = LabelVocab.from_data(t for s in [*data["train"], *data["valid"]] for t in s.tags)
        aux = {
            name: LabelVocab.from_data(v for s in data["train"] for v in s.aux[name])
            for name in settings.aux_tags
        }
        encoder.save(run_dir)
        labels.save(run_dir / LABELS)
        for name, vocab in aux.items():
            vocab.save(_aux_labels_path(run_dir, name))
        return TaggerInputs(encoder, labels, aux)

    def load_prepared(self, settings: TaggerSettings, run_dir: Path) -> TaggerInputs:
        aux = {name: LabelVocab.load(_aux_labels_path(run_dir, name)) for name in settings.aux_tags}
        return TaggerInputs(WordEncoder.load(run_dir), LabelVocab.load(run_dir / LABELS), aux)

    def model_config(
        self, config: ModelConfig, settings: TaggerSettings, prepared: TaggerInputs
    ) -> ModelConfig:
        """An encoder alone, its vocabulary the subwords' and <mask>; or the pretrained one's."""
        if settings.pretrained is not None:
            return pretrained_config(config, settings.pretrained)
        vocab_size = prepared.encoder.tokenizer.vocab_size + 1  # + <mask>
        return dataclasses.replace(
            config,
            src_vocab_size=vocab_size,
            tgt_vocab_size=vocab_size,
            pad_id=PAD_ID,
            max_len=settings.max_len,  # a piece never holds more subwords
            n_decoder_layers=0,
        )

    def build_model(
        self, config: ModelConfig, settings: TaggerSettings, prepared: TaggerInputs
    ) -> nn.Module:
        return TaggerModel(
            config,
            len(prepared.labels),
            prepared.encoder.n_chars,
            settings.char_dim,
            settings.token_dropout,
            settings.word_dropout,
            {name: len(vocab) for name, vocab in prepared.aux.items()},
            settings.char_widths,
            settings.rare_word_dropout,
        )

    def before_fit(
        self,
        model: TaggerModel,
        settings: TaggerSettings,
        prepared: TaggerInputs,
        data: Any,
        train_config: TrainConfig,
        device: str | torch.device | None = None,
    ) -> dict[str, Any]:
        """Pretrain the subword encoder on the training and unlabeled sentences (the
        character encoder learns while tagging), or copy ``--pretrained``'s."""

        def encode() -> tuple[list[list[int]], list[list[int]]]:
            sentences = [*(s.words for s in data["train"]), *data.get("unlabeled", [])]
            return tuple(
                [
                    piece.ids
                    for words in group
                    for piece in prepared.encoder.examples(words, None, settings.max_len)
                ]
                for group in (sentences, [s.words for s in data["valid"]])
            )

        return pretrain_encoder(
            model.body, settings, encode, train_config, settings.max_tokens, device
        )

    def build_task(
        self, settings: TaggerSettings, prepared: TaggerInputs, data: Any
    ) -> TaggingTask:
        return TaggingTask(
            prepared.encoder,
            prepared.labels,
            data["train"],
            data["valid"],
            settings.max_len,
            settings.max_tokens,
            settings.label_smoothing,
            prepared.aux,
            settings.aux_weight,
            count_words=settings.rare_word_dropout > 0,
        )

    def finish(
        self, predictor: Tagger, settings: TaggerSettings, data: Any, run_dir: Path
    ) -> dict[str, Any]:
        """The best weights tag the validation set; its confusion matrix goes to the run."""
        scores = predictor.evaluate(
            data["valid"], confusion_png=run_dir / CONFUSION, name=settings.valid
        )
        return {"valid_accuracy": scores["accuracy"], "valid_macro_f1": scores["macro_f1"]}

    def report(self, summary: dict[str, Any], run_dir: Path) -> str:
        return (
            f"validation accuracy {summary['valid_accuracy']:.2f}%, macro-F1 "
            f"{summary['valid_macro_f1']:.2f}%; run folder {run_dir}"
        )

    def predictor(
        self, model: nn.Module, settings: TaggerSettings, prepared: TaggerInputs, **options: Any
    ) -> Tagger:
        return Tagger(model, prepared.encoder, prepared.labels, settings, TagOptions(**options))


JOB = TaggerJob()

__all__ = [
    "IGNORE",
    "JOB",
    "MAX_WORD_SUBWORDS",
    "CharEncoder",
    "TagOptions",
    "TaggedSentence",
    "Tagger",
    "TaggerJob",
    "TaggerModel",
    "TaggerSettings",
    "TaggingTask",
    "WordEncoder",
    "align_first_subwords",
    "read_conllu",
]
