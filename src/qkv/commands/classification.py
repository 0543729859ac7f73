"""``qkv train classifier``, ``qkv classify``, and evaluation of classifiers."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from qkv.cli import add_model_options, add_train_options, model_config_from, train_config_from
from qkv.commands import EVALUATORS
from qkv.errors import InputError

FORMAT_HELP = (
    "auto (by suffix and first line), tsv (label<TAB>text), csv (label,text) or sst2 "
    "(label text); a header row like label<TAB>text is detected (default: auto)"
)


def register(commands: argparse._SubParsersAction, jobs: argparse._SubParsersAction) -> None:
    """Add this job's `qkv train` subcommand and its own commands."""
    train = jobs.add_parser(
        "classifier",
        help="one label per text (e.g. sentiment): labeled lines in, a classifier out",
        description="Train a sentence classifier on the encoder alone. A subword vocabulary is "
        "learned from the training text (and --unlabeled text) and saved in the run; the "
        "encoder can first be pretrained as a masked language model (--pretrain-steps).",
    )
    data = train.add_argument_group("data")
    data.add_argument("--train", required=True, help="training texts, one labeled text a line")
    data.add_argument("--valid", required=True, help="validation texts, same format")
    data.add_argument(
        "--format", default="auto", choices=("auto", "tsv", "csv", "sst2"), help=FORMAT_HELP
    )
    data.add_argument(
        "--pooling",
        default="mean",
        choices=("cls", "mean"),
        help="one vector per text: a [CLS] token's output or the mean of the "
        "token outputs (default: mean)",
    )
    data.add_argument(
        "--vocab-size", type=int, default=8000, help="subword vocabulary size (default: 8000)"
    )
    data.add_argument(
        "--max-len",
        type=int,
        default=256,
        help="subwords kept per text; longer texts are cut (default: 256)",
    )
    data.add_argument(
        "--word-dropout",
        type=float,
        default=0.0,
        help="chance that a training word is replaced by <unk> (default: 0)",
    )
    pretrain = train.add_argument_group("pretraining")
    pretrain.add_argument(
        "--unlabeled",
        action="append",
        default=[],
        metavar="FILE",
        help="unlabeled text, one a line, for the vocabulary and pretraining (repeatable)",
    )
    pretrain.add_argument(
        "--pretrain-steps",
        type=int,
        default=0,
        help="masked-language-model steps before fine-tuning; 0 skips pretraining (default: 0)",
    )
    pretrain.add_argument(
        "--pretrain-lr",
        type=float,
        default=None,
        help="peak learning rate of pretraining (default: --lr)",
    )
    pretrain.add_argument(
        "--pretrained",
        metavar="RUN",
        help="start from the vocabulary and pretrained encoder of an earlier run trained with "
        "--pretrain-steps (e.g. another seed)",
    )
    pretrain.add_argument(
        "--mask-prob",
        type=float,
        default=0.15,
        help="share of words the masked language model predicts (default: 0.15)",
    )
    add_model_options(train, preset="small")
    add_train_options(
        train,
        max_steps=3000,
        eval_every=200,
        warmup_steps=200,
        max_tokens=2048,
        label_smoothing=0.0,
        patience=10,
    )
    train.set_defaults(run=run_train)

    classify = commands.add_parser(
        "classify",
        help="label texts from stdin (or --input) with a trained classifier",
        description="Read texts, one a line, and write label<TAB>probability for each line "
        "(an empty line gives an empty line).",
    )
    classify.add_argument("--model", required=True, help="run folder of `qkv train classifier`")
    classify.add_argument("--input", help="text file, one text a line (default: stdin)")
    classify.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (default: cpu)")
    classify.set_defaults(run=run_classify)
    EVALUATORS["classifier"] = evaluate_classifier


def run_train(args: argparse.Namespace) -> None:
    from qkv.labeled_text import read_labeled, read_texts
    from qkv.tasks.classification import (
        ClassifierOptions,
        train_classifier,
    )

    if not 0.0 <= args.word_dropout < 1.0:
        raise InputError(f"--word-dropout {args.word_dropout} must be in [0, 1)")
    if not 0.0 < args.mask_prob < 1.0:
        raise InputError(f"--mask-prob {args.mask_prob} must be in (0, 1)")
    if args.pretrain_steps < 0:
        raise InputError(f"--pretrain-steps {args.pretrain_steps} must be 0 or more")
    train_config = train_config_from(args)
    pretrain_config = None
    if args.pretrain_steps:
        pretrain_config = dataclasses.replace(
            train_config,
            max_steps=args.pretrain_steps,
            lr=args.pretrain_lr or args.lr,
            eval_every=min(args.eval_every, args.pretrain_steps),
            label_smoothing=0.0,
            max_time=None,
            max_epochs=None,
            patience=None,
            average_last=0,
        )
    summary = train_classifier(
        read_labeled(args.train, args.format),
        read_labeled(args.valid, args.format),
        model_config_from(args),
        train_config,
        ClassifierOptions(
            pooling=args.pooling,
            vocab_size=args.vocab_size,
            max_len=args.max_len,
            word_dropout=args.word_dropout,
            mask_prob=args.mask_prob,
        ),
        unlabeled=[text for path in args.unlabeled for text in read_texts(path)],
        pretrain_config=pretrain_config,
        pretrained=args.pretrained,
        resume=args.resume,
    )
    print(
        f"best validation accuracy {summary['best_val_accuracy']:.2f}%; run folder {args.out}; "
        f"confusion matrix {summary['confusion_png']}"
    )


def run_classify(args: argparse.Namespace) -> None:
    from qkv.data import read_lines
    from qkv.tasks.classification import Classifier

    classifier = Classifier.load(args.model, device=args.device)
    if args.input:
        lines = read_lines(args.input)
    else:
        lines = [line.rstrip("\r\n") for line in sys.stdin]
    todo = [i for i, line in enumerate(lines) if line.strip()]
    outputs = [""] * len(lines)
    for i, (label, probability) in zip(
        todo, classifier.predict([lines[i] for i in todo]), strict=True
    ):
        outputs[i] = f"{label}\t{probability:.4f}"
    for line in outputs:
        print(line)


def evaluate_classifier(args: argparse.Namespace) -> dict:
    """Accuracy and macro-F1 on --data (default: the run's validation file)."""
    from qkv import checkpoint as ckpt
    from qkv.labeled_text import read_labeled
    from qkv.tasks.classification import CONFUSION, Classifier

    data = args.data
    if data is None:
        data = ckpt.read_run_config(args.model)["data"].get("valid")
        if not data or not Path(data).is_file():
            raise InputError(
                f"{args.model}: its validation file {data!r} is gone; pass --data FILE"
            )
    classifier = Classifier.load(args.model)
    return classifier.evaluate(read_labeled(data), Path(args.model) / CONFUSION)
