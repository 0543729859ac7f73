"""Each job's prediction command (``translate``, ``tag``, ``classify``, ``classify-image``).

All of them read ``--input`` (default stdin) line by line in batches and write one line per
input line to ``--output`` (default stdout); the job's prediction options come from its
``PredictOptions`` dataclass.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from qkv.cli.options import add_dataclass_options, add_runtime_options, apply_runtime, typed
from qkv.errors import InputError
from qkv.jobs.base import Job


def add_stream_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("input and output")
    group.add_argument("--input", metavar="FILE", help="read lines from FILE (default: stdin)")
    group.add_argument("--output", metavar="FILE", help="write lines to FILE (default: stdout)")
    group.add_argument(
        "--buffer-size",
        type=int,
        default=256,
        help="lines read and predicted together; a terminal is answered line by line "
        "(default: 256)",
    )
    group.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_predict_options(parser: argparse.ArgumentParser, job: Job) -> list[str]:
    """The job's prediction options; returns their dests."""
    if job.PredictOptions is None:
        return []
    return add_dataclass_options(parser.add_argument_group(job.name), job.PredictOptions)


def register(commands: argparse._SubParsersAction, jobs: list[Job]) -> None:
    for job in jobs:
        parser = commands.add_parser(
            job.predict_command,
            help=job.predict_help,
            description=job.predict_description or job.predict_help,
        )
        parser.add_argument("--model", required=True, help=f"run folder of `qkv train {job.name}`")
        parser.add_argument(
            "inputs",
            nargs="*",
            metavar="INPUT",
            help="inputs as arguments instead of lines of --input",
        )
        names = add_predict_options(parser, job)
        add_stream_options(parser)
        add_runtime_options(parser)
        parser.set_defaults(run=run_predict, job_=job, option_names=names)


def run_predict(args: argparse.Namespace) -> None:
    from qkv.cli.stream import open_output, run_stream
    from qkv.jobs import load_run

    device = apply_runtime(args)
    options: dict[str, Any] = typed(args, args.option_names)
    predictor = load_run(args.model, device, expect=args.job_.name, **options)
    if args.inputs:
        if args.input:
            raise InputError("give inputs either as arguments or as --input FILE, not both")
        lines = [" ".join(i.splitlines()) for i in args.inputs]
        outputs = predictor.predict_lines(lines)
        out = open_output(args.output)
        try:
            out.write("".join(line + "\n" for line in outputs))
            out.flush()
        finally:
            if out is not sys.stdout:
                out.close()
        return
    run_stream(
        predictor.predict_lines,
        args.input,
        args.output,
        args.buffer_size,
        progress=not args.no_progress,
    )
