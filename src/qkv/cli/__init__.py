"""The ``qkv`` command: train any job, use a trained run, evaluate it, look inside.

The commands are generated from the job registry (``qkv.jobs``): ``qkv train JOB`` for each
job, and each job's prediction command (``translate``, ``tag``, ``classify``,
``classify-image``). Every error a user can cause ends as one line, ``qkv: error: ...``, and
exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Callable, Sequence

from qkv.distributed import is_main_process, teardown
from qkv.errors import InputError


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the command, not a usage block."""

    def error(self, message: str) -> typing.NoReturn:
        print(f"{self.prog}: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("qkv")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from qkv.cli import demo, evaluate, export, inspect, predict, serve, train
    from qkv.jobs import get_job, job_names

    parser = Parser(
        prog="qkv",
        description="The Transformer of the classic description: train it, use it, look inside.",
        epilog="Run `qkv COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"qkv {version()}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=Parser
    )
    jobs = [get_job(name) for name in job_names()]
    train.register(commands, jobs)
    predict.register(commands, jobs)
    evaluate.register(commands)
    export.register(commands)
    inspect.register(commands)
    demo.register(commands)
    serve.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "takes_more", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.more = unknown
    args.argv = list(sys.argv[1:] if argv is None else argv)
    run: Callable[[argparse.Namespace], int | None] = args.run
    try:
        code = run(args) or 0
        teardown()
        return code
    except InputError as error:
        if is_main_process():  # under torchrun every rank meets the same error; one says it
            print(f"qkv: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("qkv: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
