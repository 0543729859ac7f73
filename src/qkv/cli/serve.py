"""``qkv serve``: host trained runs of any mix of jobs behind one HTTP service."""

from __future__ import annotations

import argparse

from qkv.cli.options import add_dataclass_options, add_runtime_options, apply_runtime, typed
from qkv.errors import InputError


def register(commands: argparse._SubParsersAction) -> None:
    from qkv.serve.settings import ServeSettings

    parser = commands.add_parser(
        "serve",
        help="serve trained runs over HTTP: JSON endpoints and a live attention page",
        description="Load each --model run folder once (translation, tagger, classifier or "
        "vit) and answer JSON requests for all of them, gathering concurrent requests into "
        "batches; / is a page to try them and see their attention, /docs documents the "
        "endpoints. Needs `pip install 'qkv[serve]'`.",
    )
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="[NAME=]RUN",
        help="a run folder to host, named NAME (default: the folder's name); repeat for more",
    )
    names = add_dataclass_options(parser.add_argument_group("service"), ServeSettings)
    add_runtime_options(parser)
    parser.set_defaults(run=run_serve, option_names=names)


def run_serve(args: argparse.Namespace) -> None:
    try:
        import fastapi  # noqa: F401
        import python_multipart  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise InputError(
            f"qkv serve needs FastAPI, uvicorn and python-multipart ({error}); "
            "pip install 'qkv[serve]'"
        ) from None
    from qkv.serve import ServeSettings, create_app, load_models, serve

    settings = ServeSettings(**typed(args, args.option_names))
    device = apply_runtime(args)
    models = load_models(args.model, device, settings.batch_tokens, settings.batch_wait_ms / 1000)
    serve(create_app(models, settings), settings)
