"""Pretraining an encoder on unlabeled text, for the encoder-only jobs.

The classifier and the tagger can first train their encoder to predict hidden subwords of
their training text and of unlabeled text (``--unlabeled``), for ``--pretrain-share`` of the
``--max-time`` budget (or ``--pretrain-steps``/``--pretrain-time``), in a run folder of its
own, ``<out>/pretrain``; or start from the encoder an earlier run pretrained
(``--pretrained RUN``). The encoder is then copied into the job's model and fine-tuned.

Two objectives (``--pretrain-objective``): ``mlm``, the masked language model (BERT, Devlin et
al. 2019): predict the hidden subwords; and ``electra``, replaced-token detection (ELECTRA,
Clark et al. 2020): a one-layer masked language model, the generator, fills the hidden
positions with subwords it samples, and the encoder learns to tell for every subword whether it
is the text's own. The encoder so learns from every position of a text, not only from the
hidden 15%.

The ``<mask>`` token is one id past the tokenizer's vocabulary, so the job's embedding table
has that one extra row and takes the pretrained weights as they are.

Legend: B batch, S sequence length, D model width, V vocabulary size, M masked positions.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv import checkpoint as ckpt
from qkv.config import ModelConfig, check_chances, option
from qkv.data import FIRST_WORD_ID, PAD_ID, pad_batch, read_lines, token_batches
from qkv.errors import InputError
from qkv.loss import smoothed_cross_entropy
from qkv.model import EncoderModel
from qkv.training import TrainConfig, Trainer

PRETRAIN_DIR = "pretrain"
OBJECTIVES = ("mlm", "electra")
GENERATOR_LAYERS = 1  # ELECTRA's generator: a smaller model than the encoder learns best
DETECTION_WEIGHT = 50.0  # ELECTRA's weight of the detection loss against the generator's
IGNORE = -100  # cross_entropy's ignore_index: a position with nothing to predict
CONLLU_TEXT = "# text = "  # the comment line holding a CoNLL-U sentence's raw text


@dataclass
class PretrainOptions:
    """The pretraining options of an encoder-only job (a mixin of its settings dataclass).

    A job lists it before its own settings class, ``class S(PretrainOptions, Data)``, so that
    the data options come first on the command line; it may redeclare a field to change its
    default.
    """

    unlabeled: list[str] = option(
        [],
        "unlabeled text for the vocabulary and pretraining: one text a line, or the "
        "'# text =' lines of a .conllu file; repeatable",
        metavar="FILE",
    )
    # With --max-time the budget covers the whole run: pretraining takes this share, and
    # fine-tuning the rest.
    pretrain_share: float = option(
        0.0,
        "share of --max-time spent pretraining when neither --pretrain-steps nor "
        "--pretrain-time is given (0 skips pretraining)",
    )
    pretrain_steps: int = option(
        0, "masked-language-model steps before fine-tuning; 0 leaves it to the time budget"
    )
    pretrain_time: float | None = option(
        None,
        "seconds of pretraining at most (with or instead of --pretrain-steps); with "
        "--max-time, part of that budget",
        metavar="X",
    )
    # Pretraining batches are larger: masked-token prediction is a noisier signal per text.
    pretrain_max_tokens: int | None = option(
        4096, "tokens per pretraining batch; none takes --max-tokens", metavar="N"
    )
    pretrain_lr: float | None = option(
        2e-3, "peak learning rate of pretraining; none takes --lr", metavar="X"
    )
    pretrained: str | None = option(
        None,
        "start from the vocabulary and pretrained encoder of an earlier run that pretrained "
        "(e.g. another seed)",
        metavar="RUN",
    )
    pretrain_objective: str = option(
        "mlm",
        "mlm: predict hidden subwords; electra: tell which subwords a small masked language "
        "model replaced, at every position",
        choices=OBJECTIVES,
    )
    mask_prob: float = option(0.15, "share of subwords the masked language model predicts")
    # Unlabeled text is plentiful next to the labeled data, so the language model needs less
    # dropout than the fine-tuned model.
    pretrain_dropout: float = option(0.1, "dropout while pretraining")

    def check_pretraining(self) -> None:
        """Raise an ``InputError`` naming the pretraining option whose value cannot work."""
        if not 0 < self.mask_prob < 1:
            raise InputError(f"--mask-prob {self.mask_prob} must be in (0, 1)")
        check_chances(self, "pretrain_dropout", "pretrain_share")
        if self.pretrain_steps < 0:
            raise InputError(f"--pretrain-steps {self.pretrain_steps} must be 0 or more")
        for flag, value in (
            ("--pretrain-lr", self.pretrain_lr),
            ("--pretrain-time", self.pretrain_time),
            ("--pretrain-max-tokens", self.pretrain_max_tokens),
        ):
            if value is not None and value <= 0:
                raise InputError(f"{flag} {value} must be positive")
        if self.pretrained is not None:
            if self.pretrains:
                raise InputError(
                    "give either --pretrain-steps/--pretrain-time (pretrain here) or "
                    "--pretrained RUN, not both"
                )
            pretrained_weights(self.pretrained)

    @property
    def pretrains(self) -> bool:
        """Whether this run pretrains its encoder itself, whatever the time budget."""
        return bool(self.pretrain_steps) or self.pretrain_time is not None

    def pretrain_budget(self, max_time: float | None) -> float | None:
        """Seconds of pretraining within a run of ``max_time`` seconds (None: no time limit).

        ``--pretrain-time`` when given, else ``--pretrain-share`` of ``max_time`` when the run
        has one and ``--pretrain-steps`` is not given, else no limit.
        """
        if self.pretrain_time is not None:
            return self.pretrain_time
        if max_time is not None and not self.pretrain_steps:
            return self.pretrain_share * max_time
        return None

    def pretrains_within(self, max_time: float | None) -> bool:
        """Whether a run of ``max_time`` seconds (None: steps only) pretrains its encoder."""
        if self.pretrained is not None:
            return False
        budget = self.pretrain_budget(max_time)
        return self.pretrains or (budget is not None and budget > 0)


def read_texts(path: str | Path) -> list[str]:
    """Unlabeled text for the tokenizer and pretraining: one text a line, blank lines dropped.

    A ``.conllu`` file (a treebank, e.g. Universal Dependencies) gives the raw sentence of
    each ``# text = ...`` comment line instead.
    """
    if not Path(path).is_file():
        raise InputError(f"--unlabeled {path}: no such file; give a file of texts, one a line")
    lines = read_lines(path)
    if Path(path).suffix.lower() == ".conllu":
        lines = [line.removeprefix(CONLLU_TEXT) for line in lines if line.startswith(CONLLU_TEXT)]
    return [line for line in lines if line.strip()]


# ---------------------------------------------------------------- the masked language model


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
    return inputs, src.masked_fill(~chosen, IGNORE)


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


class MaskedLMTask:
    """Masked language modelling on unlabeled text, to pretrain the encoder."""

    name = "masked_lm"
    model_class: type[nn.Module] = MaskedLanguageModel  # the model it trains
    metric = "accuracy"  # of the masked tokens
    metric_names = ("loss", "accuracy")

    def __init__(
        self,
        train_ids: list[list[int]],
        valid_ids: list[list[int]],
        mask_id: int,
        max_tokens: int,
        mask_prob: float = 0.15,
    ) -> None:
        self.train_ids, self.valid_ids = train_ids, valid_ids
        self.mask_id, self.max_tokens, self.mask_prob = mask_id, max_tokens, mask_prob

    def train_batches(self, epoch: int, seed: int) -> list[Tensor]:
        lengths = [len(s) for s in self.train_ids]
        batches = token_batches(lengths, self.max_tokens, True, seed, epoch)
        return [pad_batch([self.train_ids[i] for i in b], PAD_ID) for b in batches]

    def loss(self, model: nn.Module, batch: Tensor) -> tuple[Tensor, int]:
        """Mean cross-entropy over the masked positions."""
        inputs, targets = mask_tokens(batch, self.mask_id, self.mask_prob)
        chosen = targets != IGNORE  # (B, S)
        logits = model(inputs, chosen)  # (M, V)
        loss = smoothed_cross_entropy(logits, targets[chosen])  # fp32 whatever the logits
        return loss / max(int(chosen.sum()), 1), int((batch != PAD_ID).sum())

    def valid_batches(self) -> list[Tensor]:
        """The validation texts in padded batches (B, S), the same at every validation."""
        lengths = [len(s) for s in self.valid_ids]
        batches = token_batches(lengths, self.max_tokens, shuffle=False, seed=0)
        return [pad_batch([self.valid_ids[i] for i in b], PAD_ID) for b in batches]

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Loss and accuracy on the same masked positions at every validation."""
        generator = torch.Generator().manual_seed(0)
        device = next(model.parameters()).device
        total, right, count = 0.0, 0, 0
        for src in self.valid_batches():  # (B, S)
            inputs, targets = mask_tokens(src, self.mask_id, self.mask_prob, generator)
            chosen = targets != IGNORE  # (B, S)
            logits = model(inputs.to(device), chosen.to(device)).float().cpu()  # (M, V)
            total += F.cross_entropy(logits, targets[chosen], reduction="sum").item()
            right += int((logits.argmax(-1) == targets[chosen]).sum())
            count += int(chosen.sum())
        return {"loss": total / max(count, 1), "accuracy": 100.0 * right / max(count, 1)}


def mask_token_id(config: ModelConfig) -> int:
    """The ``<mask>`` token's id: the last row of the embedding, one past the tokenizer's ids."""
    return config.src_vocab_size - 1


def sample_words(logits: Tensor, low: int, high: int, rng: torch.Generator | None = None) -> Tensor:
    """One id in [low, high) per row of ``logits`` (M, V), drawn from their softmax there.

    Inverse-transform sampling: a uniform number looked up in each row's cumulative
    probabilities; as ``torch.multinomial`` draws (the test checks they agree), at a fraction
    of its cost on a CPU, where its exponential draws took 44% of an ELECTRA step.

    Returns:
        ids (M,)
    """
    words = logits.detach()[:, low:high].float()  # (M, high - low)
    cdf = words.softmax(-1).cumsum(-1)  # (M, high - low)
    u = torch.rand(len(cdf), 1, generator=rng).to(cdf.device) * cdf[:, -1:]  # (M, 1), < total
    index = torch.searchsorted(cdf, u, right=True).squeeze(-1)  # first id whose cdf exceeds u
    return index.clamp_(max=high - low - 1) + low


class ReplacedTokenDetector(nn.Module):
    """ELECTRA: a small masked language model (the generator) fills the hidden positions, and
    the encoder (the discriminator) with a one-unit head tells at each position "replaced"
    from "original".

    The generator shares the encoder's token embedding, as in the paper. All of it runs in
    ``forward``, so that DDP and FSDP see one module.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = EncoderModel(config)
        self.detect = nn.Linear(config.d_model, 1)
        small = dataclasses.replace(config, n_encoder_layers=GENERATOR_LAYERS)
        self.generator = MaskedLanguageModel(small)
        shared = self.encoder.embed.token.weight
        self.generator.encoder.embed.token.weight = shared
        self.generator.output.weight = shared

    def forward(
        self, inputs: Tensor, targets: Tensor, rng: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Masked ids (B, S) and their targets (B, S), -100 where nothing is hidden ->
        the generator's logits at the M hidden positions (M, V), the encoder's logit that
        each position of the generator's text was replaced (B, S), and whether it was (B, S).
        """
        chosen = targets != IGNORE  # (B, S)
        logits = self.generator(inputs, chosen)  # (M, V)
        text, replaced = inputs.clone(), torch.zeros_like(chosen)
        if len(logits):  # the sample is data for the encoder, not a gradient path (detached)
            # words only: no special id, no <mask>
            sampled = sample_words(logits, FIRST_WORD_ID, mask_token_id(self.config), rng)
            sampled = sampled.to(inputs.device)
            text[chosen] = sampled
            replaced[chosen] = sampled != targets[chosen]
        return logits, self.detect(self.encoder(text)).squeeze(-1), replaced


class ReplacedTokenTask(MaskedLMTask):
    """ELECTRA's replaced-token detection on unlabeled text, to pretrain the encoder: the
    masked language model's texts and batches, the generator's and the encoder's losses.

    Legend: W words (non-padding positions) of a batch.
    """

    name = "replaced_token_detection"
    model_class = ReplacedTokenDetector
    metric_names = ("loss", "accuracy", "detection_accuracy")  # accuracy: the generator's

    def losses(
        self, model: nn.Module, batch: Tensor, rng: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """Sums over ``batch`` (B, S): the generator's cross-entropy at the hidden positions and
        the encoder's detection loss at every word, with the logits and targets of each."""
        inputs, targets = mask_tokens(batch, self.mask_id, self.mask_prob, rng)
        logits, scores, replaced = model(inputs, targets, rng)  # (M, V), (B, S), (B, S)
        hidden = targets[targets != IGNORE]  # (M,)
        words = batch != PAD_ID  # (B, S)
        scores, replaced = scores[words].float(), replaced[words]  # (W,)
        return {
            "generator": smoothed_cross_entropy(logits, hidden),
            "detection": F.binary_cross_entropy_with_logits(
                scores, replaced.float(), reduction="sum"
            ),
            "logits": logits,
            "hidden": hidden,
            "scores": scores,
            "replaced": replaced,
        }

    def loss(self, model: nn.Module, batch: Tensor) -> tuple[Tensor, int]:
        """The generator's mean cross-entropy plus 50 times the encoder's mean detection loss."""
        parts = self.losses(model, batch)
        words, hidden = len(parts["scores"]), max(len(parts["hidden"]), 1)
        loss = parts["generator"] / hidden + DETECTION_WEIGHT * parts["detection"] / max(words, 1)
        return loss, words

    def validate(self, model: nn.Module) -> dict[str, float]:
        """Both losses and accuracies on the same hidden positions at every validation."""
        rng = torch.Generator().manual_seed(0)
        device = next(model.parameters()).device
        sums = dict.fromkeys(
            ("generator", "detection", "hidden", "right", "words", "detected"), 0.0
        )
        for src in self.valid_batches():  # (B, S)
            parts = self.losses(model, src.to(device), rng)
            sums["generator"] += float(parts["generator"])
            sums["detection"] += float(parts["detection"])
            sums["hidden"] += len(parts["hidden"])
            sums["right"] += int((parts["logits"].argmax(-1) == parts["hidden"]).sum())
            sums["words"] += len(parts["scores"])
            sums["detected"] += int(((parts["scores"] > 0) == parts["replaced"]).sum())
        hidden, words = max(sums["hidden"], 1.0), max(sums["words"], 1.0)
        return {
            "loss": sums["generator"] / hidden + DETECTION_WEIGHT * sums["detection"] / words,
            "accuracy": 100.0 * sums["right"] / hidden,
            "detection_accuracy": 100.0 * sums["detected"] / words,
        }


# ---------------------------------------------------------------- pretraining a job's encoder


TASKS = dict(zip(OBJECTIVES, (MaskedLMTask, ReplacedTokenTask), strict=True))


def pretraining_model(task: str, config: ModelConfig) -> nn.Module:
    """The model that a pretraining run of ``task`` (its config.json's ``task``) trains."""
    return next(t for t in TASKS.values() if t.name == task).model_class(config)


def load_encoder(encoder: EncoderModel, weights: Path) -> None:
    """Copy into ``encoder`` that of the pretraining model saved at ``weights``."""
    task = ckpt.read_run_config(Path(weights).parent)["task"]
    pretrained = pretraining_model(task, encoder.config)
    ckpt.load_weights(pretrained, weights)
    encoder.load_state_dict(pretrained.encoder.state_dict())


def pretrained_weights(run: str | Path) -> Path:
    """The pretrained encoder's weights in the run folder ``run``, or one clear error."""
    weights = Path(run) / PRETRAIN_DIR / ckpt.WEIGHTS
    if not weights.is_file():
        raise InputError(
            f"--pretrained {run}: holds no pretrained encoder; pass a run that pretrained "
            "(--pretrain-steps, --pretrain-time or --pretrain-share with --max-time)"
        )
    return weights


def pretrained_config(config: ModelConfig, run: str | Path) -> ModelConfig:
    """The sizes of the encoder pretrained in ``run``, with ``config``'s dropout for fine-tuning."""
    sizes = ckpt.read_run_config(Path(run) / PRETRAIN_DIR)["model"]
    regularisation = ("dropout", "attention_dropout")
    return ModelConfig.from_dict({**sizes, **{k: getattr(config, k) for k in regularisation}})


def pretrain_config(
    train_config: TrainConfig,
    steps: int,
    lr: float | None,
    run_dir: Path,
    max_time: float | None = None,
) -> TrainConfig:
    """The fine-tuning loop made a pretraining loop: ``steps`` steps (or ``max_time`` seconds)
    at ``lr``, no early stops."""
    return dataclasses.replace(
        train_config,
        out=str(run_dir / PRETRAIN_DIR),
        max_steps=steps,
        lr=lr or train_config.lr,
        eval_every=min(train_config.eval_every, steps),
        max_time=max_time,
        max_epochs=None,
        patience=None,
        average_last=0,
    )


def pretrain_encoder(
    encoder: EncoderModel,
    settings: PretrainOptions,
    encode: Callable[[], tuple[list[list[int]], list[list[int]]]],
    train_config: TrainConfig,
    max_tokens: int,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Before fine-tuning: pretrain ``encoder`` on the job's texts, or copy ``--pretrained``.

    ``encode()`` gives the subword ids of the training and of the validation texts; it is
    called only when this run pretrains.

    Pretraining runs in ``<out>/pretrain`` for ``settings``' steps or share of the time budget;
    the best weights are read back from there on every process, so that all of them start
    fine-tuning from the same encoder. With ``train_config.max_time`` the whole run keeps to
    it: ``train_config.max_time`` becomes what pretraining left for fine-tuning (config.json
    records that, so a resumed fine-tuning keeps to it too).

    Returns:
        Summary entries: ``pretraining`` (the pretraining's summary, or None) and, with a time
        budget, ``fine_tuning_max_time``.
    """
    if settings.pretrained is not None:
        load_encoder(encoder, pretrained_weights(settings.pretrained))
        return {"pretraining": None}
    max_time = train_config.max_time
    if not settings.pretrains_within(max_time):
        return {"pretraining": None}
    budget = settings.pretrain_budget(max_time)
    if max_time is not None and budget is not None and budget >= max_time:
        raise InputError(
            f"--pretrain-time {budget:g} leaves nothing of --max-time {max_time:g} for "
            "fine-tuning; give a shorter --pretrain-time or a longer --max-time"
        )
    started = time.monotonic()
    texts, valid = encode()
    config = pretrain_config(
        train_config,
        settings.pretrain_steps or 1_000_000,
        settings.pretrain_lr,
        Path(train_config.out),
        budget,
    )
    sizes = dataclasses.replace(encoder.config, dropout=settings.pretrain_dropout)
    task = TASKS[settings.pretrain_objective](
        texts,
        valid,
        mask_token_id(sizes),
        settings.pretrain_max_tokens or max_tokens,
        settings.mask_prob,
    )
    model = task.model_class(sizes)
    run_config = {"task": task.name, "model": sizes.to_dict()}
    summary = Trainer(task, model, config, run_config, device=device).fit()
    load_encoder(encoder, Path(config.out) / ckpt.WEIGHTS)
    if max_time is None:
        return {"pretraining": summary}
    train_config.max_time = max(max_time - (time.monotonic() - started), 1.0)
    return {"pretraining": summary, "fine_tuning_max_time": round(train_config.max_time, 1)}
