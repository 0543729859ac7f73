"""One path that trains any job: run folder, preparation on rank 0 first, fit, scores, summary.

``run_job`` does for every job what each once did by hand: check the run folder, read the
data, learn vocabularies once (rank 0) and share them, size and build the model, train it
with the one ``Trainer``, score the best weights on held-out data and write summary.json.
On ``resume`` the run's own saved settings are used, whatever was asked now.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from qkv import checkpoint as ckpt
from qkv.config import ModelConfig
from qkv.distributed import main_process_first
from qkv.errors import InputError
from qkv.jobs.base import SUMMARY, Job, JobSettings, read_job_name
from qkv.training import TrainConfig, Trainer


def check_run_folder(run_dir: Path, resume: bool, force: bool) -> None:
    """Refuse to train over an earlier run unless asked; refuse a resume with nothing saved.

    With ``force`` a folder holding a run is emptied first.
    """
    holds_run = (run_dir / ckpt.CONFIG).is_file()
    if resume:
        if not (run_dir / ckpt.STATE).is_file():
            raise InputError(
                f"{run_dir}: nothing to resume (no {ckpt.STATE}); train without --resume first"
            )
        return
    if run_dir.exists() and not run_dir.is_dir():
        raise InputError(f"{run_dir}: is a file, not a run folder; choose another --out")
    if holds_run and not force:
        raise InputError(
            f"{run_dir}: already holds a run; pass --resume to continue it, --force to "
            "replace it, or another --out"
        )
    if holds_run and force:
        shutil.rmtree(run_dir)
    elif run_dir.is_dir() and any(run_dir.iterdir()) and not force:
        raise InputError(
            f"{run_dir}: is not empty; choose an empty or new --out (or --force to write there)"
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".qkv-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise InputError(
            f"{run_dir}: cannot write the run folder here ({error.strerror}); choose another --out"
        ) from None


def run_job(
    job: Job,
    settings: JobSettings,
    model_config: ModelConfig,
    train_config: TrainConfig,
    *,
    resume: bool = False,
    force: bool = False,
    device: str | torch.device | None = None,
    data: Any = None,
) -> dict[str, Any]:
    """Train ``job`` into ``train_config.out`` and return the summary (also in summary.json).

    Args:
        settings: the job's settings (data paths, vocabulary size, ...).
        model_config: the model's sizes; vocabulary sizes and the like are set from the data.
        train_config: the training loop.
        resume: continue the run in ``train_config.out`` where it stopped, with its saved
            job and model settings.
        force: replace an earlier run in ``train_config.out``.
        device: where to train (default: the GPU of this process if there is one, else CPU).
        data: the job's data already read (from Python); default ``job.read_data(settings)``.
    """
    run_dir = Path(train_config.out)
    if resume:
        check_run_folder(run_dir, resume=True, force=False)
        name, saved = read_job_name(run_dir)
        if name != job.name:
            raise InputError(f"{run_dir}: a {name!r} run; resume it as `qkv train {name}`")
        settings = job.Settings.saved(saved.get("settings", {}))
        model_config = ModelConfig.from_dict(saved["model"])
    else:
        settings = job.resolve(settings)
        settings.check()
    if data is None:
        data = job.read_data(settings)

    if resume:
        prepared = job.load_prepared(settings, run_dir)
    else:

        def prepare() -> Any:
            check_run_folder(run_dir, resume=False, force=force)
            return job.prepare(settings, data, run_dir)

        prepared = main_process_first(prepare, then=lambda: job.load_prepared(settings, run_dir))
        model_config = job.model_config(model_config, settings, prepared)

    torch.manual_seed(train_config.seed)  # --seed decides the initial weights too
    model = job.build_model(model_config, settings, prepared)
    summary_extra: dict[str, Any] = {}
    if not resume:
        summary_extra = job.before_fit(model, settings, prepared, data, train_config, device)
    task = job.build_task(settings, prepared, data)
    run_config = {
        "job": job.name,
        "model": model_config.to_dict(),
        "settings": settings.to_dict(),
    }
    trainer = Trainer(task, model, train_config, run_config, resume=resume, device=device)
    summary = trainer.fit()
    summary.update(summary_extra)
    if trainer.is_main:
        predictor = job.predictor(trainer.model.eval(), settings, prepared)
        summary.update(job.finish(predictor, settings, data, run_dir))
        ckpt.write_json(run_dir / SUMMARY, summary)
    return summary
