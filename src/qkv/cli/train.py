"""``qkv train JOB``: one subcommand per registered job, its options from its dataclasses.

Every job's command has the same groups: data (the job's settings), model (``--preset`` and
the sizes the job uses), training (the loop, the same for every job), runtime (``--device``,
``--threads``). ``--config RUN/config.json`` starts from a saved run's settings; options typed
on the command line override them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from qkv.cli.options import (
    add_dataclass_options,
    add_model_options,
    add_runtime_options,
    apply_runtime,
    typed,
)
from qkv.config import ModelConfig
from qkv.errors import InputError
from qkv.jobs.base import Job
from qkv.launch import launch, launched
from qkv.training import TrainConfig


def register(commands: argparse._SubParsersAction, jobs: list[Job]) -> None:
    train = commands.add_parser(
        "train",
        help="train a model into a run folder",
        description="Train a model for one job into a run folder.",
    )
    subcommands = train.add_subparsers(
        dest="job", metavar="JOB", required=True, parser_class=type(train)
    )
    for job in jobs:
        add_job_parser(subcommands, job)


def add_job_parser(subcommands: argparse._SubParsersAction, job: Job) -> None:
    parser = subcommands.add_parser(job.name, help=job.summary, description=job.description)
    settings = add_dataclass_options(
        parser.add_argument_group("data and job settings"), job.Settings
    )
    models = add_model_options(parser, job.model_options, job.preset, job.model_defaults)
    group = parser.add_argument_group("training")
    group.add_argument("--out", required=True, help="run folder to write (created if needed)")
    group.add_argument(
        "--resume", action="store_true", help="continue the run in --out exactly where it stopped"
    )
    group.add_argument(
        "--force", action="store_true", help="replace the run already in --out, if any"
    )
    group.add_argument(
        "--config",
        metavar="FILE",
        help="start from the settings of a saved run's config.json (or run folder); "
        "options given here override them",
    )
    group.add_argument("--no-progress", action="store_true", help="no progress bar or lines")
    group.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="train on N processes of this machine, as torchrun --nproc_per_node N: each a "
        "DDP replica (or FSDP shard) with an equal share of the CPU threads (default: 1)",
    )
    loop = add_dataclass_options(group, TrainConfig, job.train_defaults)
    add_runtime_options(parser)
    parser.set_defaults(
        run=run_train, job_=job, settings_names=settings, model_names=models, train_names=loop
    )


def read_saved_config(path: str, job: Job) -> dict[str, Any]:
    """The config.json at ``path`` (or in the run folder ``path``), checked to be ``job``'s."""
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        saved = json.loads(file.read_text(encoding="utf-8"))
    except OSError as error:
        raise InputError(f"--config {file}: cannot be read ({error.strerror})") from None
    except ValueError as error:
        raise InputError(f"--config {file}: not valid JSON ({error})") from None
    name = saved.get("job", saved.get("task")) if isinstance(saved, dict) else None
    if name != job.name:
        raise InputError(f"--config {file}: holds a {name!r} run, not a {job.name!r} run")
    return saved


def saved_config(args: argparse.Namespace, job: Job) -> dict[str, Any]:
    """--config's run; on --resume, the run itself, so its loop settings (the schedule's
    --max-steps among them) hold unless typed again."""
    if args.config:
        return read_saved_config(args.config, job)
    if args.resume:
        try:
            return read_saved_config(args.out, job)
        except InputError:  # the resume itself says what is wrong with the folder
            return {}
    return {}


def model_config_from(args: argparse.Namespace, job: Job, saved: dict[str, Any]) -> ModelConfig:
    """Preset (or the saved model) < the job's fixed choices < the options typed."""
    overrides = typed(args, args.model_names)
    try:
        if saved.get("model") and not hasattr(args, "preset"):
            return ModelConfig.from_dict({**saved["model"], **overrides})
        preset = getattr(args, "preset", job.preset)
        return ModelConfig.preset(preset, **{**job.model_defaults, **overrides})
    except (TypeError, ValueError) as error:
        raise InputError(str(error)) from None


def configs_from(args: argparse.Namespace) -> tuple[Any, ModelConfig, TrainConfig]:
    """The job's settings, the model's and the loop's, from defaults, --config and options."""
    job: Job = args.job_
    saved = saved_config(args, job)
    settings = {**saved.get("settings", {}), **typed(args, args.settings_names)}
    # Runs saved before --lr-schedule existed decayed by the inverse square root.
    saved_loop = {"lr_schedule": "inverse_sqrt", **saved["train"]} if saved.get("train") else {}
    loop = {**job.train_defaults, **saved_loop, **typed(args, args.train_names)}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    loop = {k: v for k, v in loop.items() if k in known}
    loop.update(out=args.out, progress=not args.no_progress)
    try:
        job_settings = job.Settings.from_dict(settings)
    except (TypeError, ValueError) as error:
        raise InputError(f"invalid {job.name} settings: {error}") from None
    return job_settings, model_config_from(args, job, saved), TrainConfig.from_dict(loop)


def run_train(args: argparse.Namespace) -> int | None:
    from qkv.distributed import is_main_process
    from qkv.jobs.run import run_job

    device = apply_runtime(args)
    settings, model_config, train_config = configs_from(args)  # bad options fail here, once
    if args.processes != 1 and not launched():
        return launch(args.processes, args.argv, args.threads)
    summary = run_job(
        args.job_,
        settings,
        model_config,
        train_config,
        resume=args.resume,
        force=args.force,
        device=device,
    )
    if is_main_process():  # the scores of the held-out data are rank 0's
        print(args.job_.report(summary, Path(args.out)), flush=True)
    return None
