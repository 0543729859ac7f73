"""Pretraining the classifier's encoder as a masked language model, or taking an earlier one.

A run with ``--pretrain-steps N`` first trains a ``MaskedLanguageModel`` on the training and
unlabeled texts in its own run folder ``<out>/pretrain``, then copies the encoder into the
classifier. A run with ``--pretrained RUN`` instead starts from the tokenizer, the sizes and
the pretrained encoder of that earlier run (e.g. to fine-tune several seeds on one pretraining).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from qkv import checkpoint as ckpt
from qkv.config import ModelConfig
from qkv.errors import InputError
from qkv.jobs.classification.model import MaskedLanguageModel, SequenceClassifier, load_encoder
from qkv.jobs.classification.task import MaskedLMTask
from qkv.training import TrainConfig, Trainer

PRETRAIN_DIR = "pretrain"


def pretrained_weights(run: str | Path) -> Path:
    """The pretrained encoder's weights in the run folder ``run``, or one clear error."""
    weights = Path(run) / PRETRAIN_DIR / ckpt.WEIGHTS
    if not weights.is_file():
        raise InputError(
            f"--pretrained {run}: holds no pretrained encoder; pass a run trained with "
            "--pretrain-steps"
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
    model: SequenceClassifier,
    texts: list[list[int]],
    valid: list[list[int]],
    config: TrainConfig,
    mask_prob: float,
    max_tokens: int,
    dropout: float,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Train a masked language model on ``texts`` into ``config.out``; copy its encoder.

    The best weights are read back from the pretraining run folder on every process, so
    that all of them start fine-tuning from the same encoder.

    Returns:
        The pretraining's summary.
    """
    language_model = MaskedLanguageModel(dataclasses.replace(model.config, dropout=dropout))
    mask_id = model.config.src_vocab_size - 1  # one past the tokenizer's ids
    task = MaskedLMTask(texts, valid, mask_id, max_tokens, mask_prob)
    run_config = {"task": "masked_lm", "model": language_model.config.to_dict()}
    summary = Trainer(task, language_model, config, run_config, device=device).fit()
    load_encoder(model, Path(config.out) / ckpt.WEIGHTS)
    return summary
