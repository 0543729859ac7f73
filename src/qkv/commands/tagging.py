"""``qkv train tagger``, ``qkv tag``, and evaluation of taggers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qkv.cli import add_model_options, add_train_options, model_config_from, train_config_from
from qkv.commands import EVALUATORS
from qkv.errors import InputError

FORMATS = ("word-tag", "conllu")


def register(commands: argparse._SubParsersAction, jobs: argparse._SubParsersAction) -> None:
    """Add ``qkv train tagger`` and ``qkv tag``; register the tagger's evaluation."""
    train = jobs.add_parser(
        "tagger",
        help="one label per word: CoNLL-U in, a part-of-speech tagger out",
        description="Train a part-of-speech tagger on CoNLL-U files. Words are split into "
        "subwords (learned from the training words) and read by their characters too; each "
        "word's tag is predicted at its first subword. The best weights tag --valid into "
        "confusion.png in the run folder.",
    )
    data = train.add_argument_group("data")
    data.add_argument("--train", required=True, help="training sentences, CoNLL-U")
    data.add_argument("--valid", required=True, help="validation sentences, CoNLL-U")
    data.add_argument(
        "--tagset",
        choices=("upos", "xpos"),
        default="upos",
        help="upos: universal tags (column 4); xpos: language-specific tags (column 5) "
        "(default: upos)",
    )
    data.add_argument(
        "--vocab-size", type=int, default=4000, help="subword vocabulary size (default: 4000)"
    )
    data.add_argument(
        "--char-dim",
        type=int,
        default=64,
        help="width of the character embeddings of the word encoder; 0: subwords only "
        "(default: 64)",
    )
    data.add_argument(
        "--token-dropout",
        type=float,
        default=0.1,
        help="share of subwords hidden as <unk> while training, so that unseen words are "
        "tagged from characters and context (default: 0.1)",
    )
    add_model_options(train, preset="small")
    add_train_options(
        train,
        max_steps=20000,
        eval_every=500,
        warmup_steps=500,
        lr=1e-3,
        max_tokens=2000,
        patience=None,
    )
    train.set_defaults(run=run_train)

    tag = commands.add_parser(
        "tag",
        help="tag sentences with a trained tagger",
        description="Read sentences from stdin (or --input), one a line, words split on "
        "whitespace, and write `word/TAG ...` lines (an empty line gives an empty line) or "
        "CoNLL-U blocks.",
    )
    tag.add_argument("--model", required=True, help="run folder of `qkv train tagger`")
    tag.add_argument("--input", help="text file, one sentence a line (default: stdin)")
    tag.add_argument(
        "--format", choices=FORMATS, default="word-tag", help="output format (default: word-tag)"
    )
    tag.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (default: cpu)")
    tag.set_defaults(run=run_tag)
    EVALUATORS["tagger"] = evaluate_tagger


def run_train(args: argparse.Namespace) -> None:
    from qkv.tasks.tagging import train_tagger

    if args.char_dim < 0 or not 0 <= args.token_dropout < 1:
        raise InputError(
            f"--char-dim {args.char_dim} must be >= 0 and --token-dropout "
            f"{args.token_dropout} in [0, 1)"
        )
    summary = train_tagger(
        args.train,
        args.valid,
        model_config_from(args),
        train_config_from(args),
        tagset=args.tagset,
        vocab_size=args.vocab_size,
        char_dim=args.char_dim,
        token_dropout=args.token_dropout,
        resume=args.resume,
    )
    if "valid_accuracy" in summary:  # rank 0 only, under torchrun
        print(
            f"validation accuracy {summary['valid_accuracy']:.2f}%, macro-F1 "
            f"{summary['valid_macro_f1']:.2f}%; run folder {args.out}"
        )


def conllu_block(number: int, text: str, tagged: list[tuple[str, str]], tagset: str) -> str:
    """One sentence as CoNLL-U: the tag in the UPOS or XPOS column, the rest ``_``."""
    lines = [f"# sent_id = {number}", f"# text = {text}"]
    for i, (word, tag) in enumerate(tagged, start=1):
        upos, xpos = (tag, "_") if tagset == "upos" else ("_", tag)
        lines.append("\t".join([str(i), word, "_", upos, xpos, "_", "_", "_", "_", "_"]))
    return "\n".join(lines) + "\n"


def run_tag(args: argparse.Namespace) -> None:
    from qkv.data import read_lines
    from qkv.tasks.tagging import Tagger

    tagger = Tagger.load(args.model, device=args.device)
    if args.input:
        lines = read_lines(args.input)
    else:
        lines = [line.rstrip("\r\n") for line in sys.stdin]
    for number, (line, tagged) in enumerate(zip(lines, tagger.tag(lines), strict=True), 1):
        if args.format == "word-tag":
            print(" ".join(f"{word}/{tag}" for word, tag in tagged))
        elif tagged:  # CoNLL-U has no empty sentences; sent_id keeps the input line number
            print(conllu_block(number, " ".join(line.split()), tagged, tagger.tagset))


def evaluate_tagger(args: argparse.Namespace) -> dict:
    """Accuracy and macro-F1 on --data (default: the run's validation file), confusion.png."""
    from qkv import checkpoint as ckpt
    from qkv.tasks.tagging import CONFUSION, Tagger
    from qkv.treebank import read_conllu

    data = args.data
    if data is None:
        data = ckpt.read_run_config(args.model).get("tagging", {}).get("valid")
        if not data or not Path(data).is_file():
            raise InputError(
                f"{args.model}: its validation file {data!r} is gone; pass --data FILE.conllu"
            )
    tagger = Tagger.load(args.model)
    sentences = read_conllu(data, tagger.tagset)
    scores = tagger.evaluate(sentences, Path(args.model) / CONFUSION, name=data)
    return {"data": str(data), "tagset": tagger.tagset, **scores}
