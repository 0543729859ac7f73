"""``qkv attention``, ``qkv explain`` and ``qkv plot``: pictures of what a run does inside."""

from __future__ import annotations

import argparse
from pathlib import Path

from qkv.cli.options import add_runtime_options, apply_runtime
from qkv.errors import InputError


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``qkv attention``, ``qkv explain`` and ``qkv plot``."""
    add_attention(commands)
    add_explain(commands)
    add_plot(commands)


def add_run_and_input(parser: argparse.ArgumentParser) -> None:
    """``--model RUN`` and the one INPUT that attention and explain look at."""
    parser.add_argument("--model", required=True, help="run folder written by `qkv train`")
    parser.add_argument(
        "input", metavar="INPUT", help="a sentence (a text for a classifier; an image for vit)"
    )


def add_attention(commands: argparse._SubParsersAction) -> None:
    attention = commands.add_parser(
        "attention",
        help="draw a run's attention on one input: PNG heatmaps or an interactive page",
        description="Run a trained model on one input and draw every layer's and head's "
        "attention: PNG heatmaps into --out (translation: encoder self-attention, decoder "
        "masked self-attention, encoder-decoder attention; tagger and classifier: encoder "
        "self-attention; vit: the [CLS] token's attention over the image), and/or one "
        "self-contained HTML page with --html.",
    )
    add_run_and_input(attention)
    attention.add_argument("--out", help="folder for the PNG heatmaps (created if needed)")
    attention.add_argument("--html", help="write the interactive page to this .html file")
    attention.add_argument("--layer", type=int, help="draw only this layer (from 0)")
    attention.add_argument(
        "--head", type=int, help="draw only this head (from 0), as one large heatmap"
    )
    add_runtime_options(attention)
    attention.set_defaults(run=run_attention)


def add_explain(commands: argparse._SubParsersAction) -> None:
    explain = commands.add_parser(
        "explain",
        help="the three steps of attention with a run's real numbers, for one query token",
        description="Recompute one query of one attention from the layer's own input: (1) "
        "score q·k/√d_k against every key, (2) softmax the scores into weights, (3) take the "
        "weighted sum of the values. Prints one row per key token. A translator has three "
        "kinds: encoder self-attention, decoder masked self-attention (queries and keys are "
        "<s> and the output so far) and encoder-decoder attention (queries from the output, "
        "keys and values from the source).",
    )
    add_run_and_input(explain)
    explain.add_argument("--token", type=int, default=0, help="query token, from 0 (default: 0)")
    explain.add_argument(
        "--kind",
        choices=("encoder", "decoder", "cross"),
        default="encoder",
        help="which attention: encoder self-attention, decoder masked self-attention, or "
        "encoder-decoder (cross) attention (default: encoder)",
    )
    explain.add_argument("--layer", type=int, default=0, help="layer, from 0 (default: 0)")
    explain.add_argument("--head", type=int, default=0, help="head (default: 0)")
    explain.add_argument("--png", help="also draw the three steps into this PNG file")
    add_runtime_options(explain)
    explain.set_defaults(run=run_explain)


def add_plot(commands: argparse._SubParsersAction) -> None:
    plot = commands.add_parser(
        "plot",
        help="draw a run's training curves, or the positional encoding",
        description="Draw the losses, validation metrics and learning rate of a run from its "
        "metrics.csv into one PNG; or, with --positional-encoding, the sinusoid table.",
    )
    plot.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="run folder of `qkv train`")
    plot.add_argument("--out", help="PNG to write (default: RUN_DIR/curves.png)")
    plot.add_argument(
        "--positional-encoding",
        action="store_true",
        help="draw PE[pos, i] of the sinusoidal positional encoding instead",
    )
    plot.add_argument("--max-len", type=int, default=100, help="positions to draw (default: 100)")
    plot.add_argument("--d-model", type=int, default=128, help="model width (default: 128)")
    plot.set_defaults(run=run_plot)


def run_attention(args: argparse.Namespace) -> None:
    from qkv.viz.attention import check_index, run_attention
    from qkv.viz.heatmaps import attention_pictures
    from qkv.viz.page import write_attention_page

    if not (args.out or args.html):
        raise InputError("nothing to write: give --out DIR for PNG heatmaps and/or --html FILE")
    attention = run_attention(args.model, args.input, apply_runtime(args))
    first = attention.kinds[0]
    if args.layer is not None:
        check_index(args.layer, max(k.n_layers for k in attention.kinds), "--layer", "layers")
    if args.head is not None:
        check_index(args.head, first.n_heads, "--head", "heads")
    print(f"output: {attention.output}")
    paths = []
    if args.out:
        paths += attention_pictures(attention, args.out, args.layer, args.head)
    if args.html:
        paths.append(write_attention_page(attention, args.html))
    for path in paths:
        print(path)


def run_explain(args: argparse.Namespace) -> None:
    from qkv.jobs import load_run
    from qkv.viz.explain import explain_query, format_steps
    from qkv.viz.heatmaps import save_figure, three_steps_figure

    predictor = load_run(args.model, apply_runtime(args))
    steps = explain_query(predictor, args.input, args.kind, args.layer, args.head, args.token)
    print(format_steps(steps))
    if args.png:
        print(save_figure(three_steps_figure(steps), args.png))


def run_plot(args: argparse.Namespace) -> None:
    from qkv import checkpoint as ckpt
    from qkv.jobs.base import read_job_name
    from qkv.viz.curves import positional_encoding_figure, read_metrics, training_curves_figure
    from qkv.viz.heatmaps import save_figure

    if args.positional_encoding:
        if args.run_dir:
            raise InputError("give either RUN_DIR or --positional-encoding, not both")
        if not args.out:
            raise InputError("--positional-encoding needs --out FILE.png")
        figure = positional_encoding_figure(args.max_len, args.d_model)
        print(save_figure(figure, args.out))
        return
    if not args.run_dir:
        raise InputError("give a RUN_DIR to draw its training curves, or --positional-encoding")
    run_dir = Path(args.run_dir)
    task, _ = read_job_name(run_dir)
    metrics = read_metrics(run_dir / ckpt.METRICS)
    figure = training_curves_figure(metrics, f"{run_dir.name}: {task} training")
    print(save_figure(figure, args.out or run_dir / "curves.png"))
