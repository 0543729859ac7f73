"""What a job is: its settings, how it reads data, builds a model and a Task, and is used.

A job (translation, tagger, classifier, vit) is a ``Job`` subclass in its own package under
``qkv.jobs``. It supplies only what differs between jobs; ``qkv.jobs.run.run_job`` trains any
of them the same way, ``load_run`` loads any run folder, and the command line is generated
from the job's settings dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from qkv import checkpoint as ckpt
from qkv.config import ModelConfig, check_chances, option
from qkv.errors import InputError

if typing.TYPE_CHECKING:
    from qkv.training import Task, TrainConfig
    from qkv.viz.attention import RunAttention

SUMMARY = "summary.json"
# Written by `qkv export` beside an exported model; names the job it came from.
EXPORT_INFO = "qkv-export.json"
# ModelConfig fields a job may show on its command line.
ENCODER_OPTIONS = (
    "d_model",
    "n_heads",
    "d_ff",
    "n_encoder_layers",
    "dropout",
    "attention_dropout",
    "dropout_impl",
    "activation",
    "positional",
    "norm_first",
)
ENCODER_DECODER_OPTIONS = (*ENCODER_OPTIONS[:4], "n_decoder_layers", *ENCODER_OPTIONS[4:])


@dataclass
class JobSettings:
    """Settings every job has besides the model's and the training loop's.

    A job subclasses it with its own fields (each an ``option``), which become its
    ``qkv train JOB`` options and are saved in config.json as ``settings``.
    """

    train: str | None = option(None, "training data", metavar="PATH")
    valid: str | None = option(None, "validation data", metavar="PATH")
    label_smoothing: float = option(0.1, "label smoothing of the cross-entropy (0 disables)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> JobSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    @classmethod
    def saved(cls, values: dict[str, Any]) -> JobSettings:
        """Settings read back from a run folder; a job may fill in what older runs lack."""
        return cls.from_dict(values)

    def check(self) -> None:
        """Raise an ``InputError`` naming the option when a value cannot work."""
        check_chances(self, "label_smoothing")


class Job:
    """One kind of work the Transformer does. Subclasses set the class attributes and hooks.

    Attributes:
        name: the registry key, ``qkv train NAME``, and ``job`` in config.json.
        summary, description: help texts of ``qkv train NAME``.
        Settings: the job's settings dataclass (a ``JobSettings``).
        PredictOptions: a dataclass of how a trained run predicts (beam size, ...), the
            options of its prediction command and of ``evaluate``.
        predict_command: the command that uses a trained run (``translate``, ``tag`` ...).
        predict_help: its one-line help.
        model_options: the ModelConfig fields shown as options.
        model_defaults: ModelConfig fields the job sets, over the preset.
        preset: the default model size.
        train_defaults: TrainConfig values of the job's recipe.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    description: ClassVar[str]
    Settings: ClassVar[type[JobSettings]] = JobSettings
    PredictOptions: ClassVar[type | None] = None
    predict_command: ClassVar[str]
    predict_help: ClassVar[str]
    predict_description: ClassVar[str] = ""
    model_options: ClassVar[tuple[str, ...]] = ENCODER_OPTIONS
    model_defaults: ClassVar[dict[str, Any]] = {}
    preset: ClassVar[str] = "small"
    train_defaults: ClassVar[dict[str, Any]] = {}

    # -- training ------------------------------------------------------------------------------

    def resolve(self, settings: JobSettings) -> JobSettings:
        """Settings with defaults that depend on other settings filled in (before saving)."""
        return settings

    def read_data(self, settings: JobSettings) -> Any:
        """The training and validation data, as the Task and ``finish`` want it."""
        raise NotImplementedError

    def prepare(self, settings: JobSettings, data: Any, run_dir: Path) -> Any:
        """Learn vocabularies and labels from the training data and save them in ``run_dir``.

        Returns the job's own object holding them (its "prepared" inputs). Runs once, on
        rank 0, while the other ranks wait and then ``load_prepared``.
        """
        raise NotImplementedError

    def load_prepared(self, settings: JobSettings, run_dir: Path) -> Any:
        """What ``prepare`` saved in ``run_dir``."""
        raise NotImplementedError

    def model_config(
        self, config: ModelConfig, settings: JobSettings, prepared: Any
    ) -> ModelConfig:
        """``config`` sized for the prepared vocabularies (vocabulary sizes, max_len ...)."""
        return config

    def build_model(self, config: ModelConfig, settings: JobSettings, prepared: Any) -> nn.Module:
        raise NotImplementedError

    def build_task(self, settings: JobSettings, prepared: Any, data: Any) -> Task:
        raise NotImplementedError

    def before_fit(
        self,
        model: nn.Module,
        settings: JobSettings,
        prepared: Any,
        data: Any,
        train_config: TrainConfig,
        device: str | torch.device | None = None,
    ) -> dict[str, Any]:
        """Work on a new run before training starts (e.g. pretraining); returns summary entries."""
        return {}

    def finish(
        self, predictor: Predictor, settings: JobSettings, data: Any, run_dir: Path
    ) -> dict[str, Any]:
        """Score the trained run on held-out data (rank 0); returns summary entries."""
        return {}

    def report(self, summary: dict[str, Any], run_dir: Path) -> str:
        """The line printed when training ends."""
        metric = next((k for k in summary if k.startswith("best_val_")), None)
        value = summary.get(metric) if metric else None
        best = f"{metric.removeprefix('best_val_')} {value:.2f}; " if value is not None else ""
        return f"best validation {best}run folder {run_dir}"

    # -- using a trained run -------------------------------------------------------------------

    def predictor(
        self, model: nn.Module, settings: JobSettings, prepared: Any, **options: Any
    ) -> Predictor:
        raise NotImplementedError

    def load_export(self, folder: Path, **options: Any) -> Predictor | None:
        """A predictor of an exported model in ``folder`` (an export folder, or a run folder
        holding one) when ``options`` ask for it; None loads the run's PyTorch model."""
        return None


class Predictor:
    """A trained run put to use; each job's predictor subclasses it.

    ``XPredictor.load(run_dir)`` loads a run folder of that job; ``predict_lines`` serves the
    line-by-line prediction command; ``evaluate_data`` serves ``qkv evaluate``; ``attention``
    serves ``qkv attention`` and ``qkv explain``.
    """

    job: ClassVar[str]
    model: nn.Module
    settings: JobSettings

    @classmethod
    def load(cls, run_dir: str | Path, device: str | torch.device = "cpu", **options: Any):
        return load_run(run_dir, device, expect=cls.job, **options)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def predict_lines(self, lines: list[str], first_number: int = 1) -> list[str]:
        """One output line per input line (``first_number`` numbers the first, from 1)."""
        raise NotImplementedError

    def evaluate_data(self, data: str | None, out: Path | None) -> dict[str, Any]:
        """Scores on the data at ``data`` (default: the run's held-out data).

        A confusion matrix or other pictures go into ``out`` when it is given.
        """
        raise NotImplementedError

    def attention(self, text: str) -> RunAttention:
        """The output on ``text`` and every layer's and head's attention weights."""
        raise NotImplementedError

    def data_path(self, data: str | None, form: str) -> str:
        """``data``, or the run's validation file when None; one clear error when it is gone."""
        path = data or getattr(self.settings, "valid", None)
        if data is None and (not path or not Path(path).is_file()):
            raise InputError(f"the run's validation file {path!r} is gone; pass --data {form}")
        return path


def picture_path(out: Path | None, name: str) -> Path | None:
    """``out``/``name``, creating ``out``; None when no folder for pictures was given."""
    if out is None:
        return None
    Path(out).mkdir(parents=True, exist_ok=True)
    return Path(out) / name


def read_job_name(run_dir: str | Path) -> tuple[str, dict[str, Any]]:
    """The job of the run in ``run_dir`` and its config.json."""
    config = ckpt.read_run_config(run_dir)
    name = config.get("job", config.get("task"))
    if not isinstance(name, str):
        raise InputError(f"{Path(run_dir) / ckpt.CONFIG}: names no job; the run folder is damaged")
    return name, config


def load_run(
    run_dir: str | Path,
    device: str | torch.device = "cpu",
    expect: str | None = None,
    **options: Any,
) -> Predictor:
    """Load the run in ``run_dir`` (any job) as its job's ``Predictor`` on ``device``.

    Args:
        expect: the job the caller needs; another job's run is an ``InputError``.
        options: the job's prediction options (``PredictOptions`` fields).
    """
    from qkv.jobs import get_job

    run_dir = Path(run_dir)
    if (run_dir / EXPORT_INFO).is_file():
        return _load_export(run_dir, expect, **options)
    name, config = read_job_name(run_dir)
    if expect is not None and name != expect:
        raise InputError(f"{run_dir}: a {name!r} run, not a {expect!r} run")
    job = get_job(name, where=str(run_dir / ckpt.CONFIG))
    predictor = job.load_export(run_dir, **options)
    if predictor is not None:
        return predictor
    settings = job.Settings.saved(config.get("settings", {}))
    prepared = job.load_prepared(settings, run_dir)
    try:
        model_config = ModelConfig.from_dict(config["model"])
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(f"{run_dir / ckpt.CONFIG}: no usable model settings ({error})") from None
    model = job.build_model(model_config, settings, prepared)
    ckpt.load_weights(model, run_dir / ckpt.WEIGHTS)
    return job.predictor(model.to(device).eval(), settings, prepared, **options)


def _load_export(folder: Path, expect: str | None, **options: Any) -> Predictor:
    """An export folder (``qkv export``): its job's predictor of the exported model."""
    from qkv.jobs import get_job

    path = folder / EXPORT_INFO
    try:
        name = json.loads(path.read_text(encoding="utf-8"))["job"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(f"{path}: not a readable export description ({error})") from None
    if expect is not None and name != expect:
        raise InputError(f"{folder}: an export of a {name!r} run, not a {expect!r} run")
    predictor = get_job(name, where=str(path)).load_export(folder, **options)
    if predictor is None:
        raise InputError(f"{folder}: an exported model, which this job cannot load")
    return predictor
