"""The job registry: the one place that knows the job names.

Commands, evaluation, pictures and explanations ask it for a job by name (from the command
line or a run's config.json); nothing else switches on a job's name. A job is a package under
``qkv.jobs`` whose ``JOB`` is a ``qkv.jobs.base.Job``; a new job is one package and one line
here. Packages are imported on first use, so ``qkv --help`` stays quick.
"""

from __future__ import annotations

import importlib

from qkv.errors import InputError
from qkv.jobs.base import Job, JobSettings, Predictor, load_run

JOBS: dict[str, str] = {
    "translation": "qkv.jobs.translation",
    "tagger": "qkv.jobs.tagging",
    "classifier": "qkv.jobs.classification",
    "vit": "qkv.jobs.vision",
}


def job_names() -> list[str]:
    return list(JOBS)


def get_job(name: str, where: str = "") -> Job:
    """The registered job called ``name``; an unknown name is an ``InputError``."""
    if name not in JOBS:
        prefix = f"{where}: " if where else ""
        raise InputError(f"{prefix}no job called {name!r}; the jobs are {', '.join(JOBS)}")
    job = importlib.import_module(JOBS[name]).JOB
    assert job.name == name, f"{JOBS[name]}.JOB is {job.name!r}, registered as {name!r}"
    return job


__all__ = ["JOBS", "Job", "JobSettings", "Predictor", "get_job", "job_names", "load_run"]
