"""The models a service hosts: run folders loaded once at start, each with its batcher.

A hosted model answers the endpoint of its job's prediction command (``Job.predict_command``:
``translate``, ``tag``, ``classify``, ``classify-image``); ``RUNNERS`` says how each command
runs a gathered batch. The job names themselves are the registry's (``qkv.jobs``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qkv.errors import InputError
from qkv.jobs import Job, Predictor, get_job, load_run
from qkv.serve.batching import Batcher, RunBatch


def run_translate(predictor: Any, key: Hashable, sources: list[list[int]]) -> list[str]:
    """Subword ids of each source -> its translation, with the request's (beam, penalty)."""
    beam_size, length_penalty = key
    translator = copy.copy(predictor)  # the same model, this batch's decoding options
    translator.options = dataclasses.replace(
        predictor.options, beam_size=beam_size, length_penalty=length_penalty
    )
    outputs = translator.translate_ids(sources)
    return [predictor.tokenizer.decode(ids) for ids in outputs]


def run_tag(predictor: Any, key: Hashable, sentences: list[str]) -> list[list[dict[str, str]]]:
    return [[{"word": w, "tag": t} for w, t in pairs] for pairs in predictor.tag(sentences)]


def run_classify(predictor: Any, key: Hashable, inputs: list[Any]) -> list[dict[str, Any]]:
    """Texts, or images, -> the most probable label of each and its probability."""
    return [{"label": label, "probability": p} for label, p in predictor.predict(inputs)]


RUNNERS = {
    "translate": run_translate,
    "tag": run_tag,
    "classify": run_classify,
    "classify-image": run_classify,
}


@dataclass
class HostedModel:
    """One run folder put to use by the service.

    Attributes:
        name: how requests name it (``"model": NAME``).
        folder: the run folder it was loaded from.
        job: its job, from the registry.
        predictor: the job's predictor of the loaded run.
        batcher: gathers its concurrent requests (see ``qkv.serve.batching``).
    """

    name: str
    folder: Path
    job: Job
    predictor: Predictor
    batcher: Batcher

    @property
    def command(self) -> str:
        """The job's prediction command, which is also the endpoint it answers."""
        return self.job.predict_command

    @property
    def reads_images(self) -> bool:
        return hasattr(self.predictor, "image")

    def info(self) -> dict[str, Any]:
        """What /v1/models says of it: job, endpoint, sizes, languages and labels."""
        p, settings = self.predictor, self.predictor.settings
        config = p.model.config
        sizes = {
            k: getattr(config, k)
            for k in ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers")
        }
        if self.command != "translate":
            sizes.pop("n_decoder_layers")
        sizes["max_len"] = config.max_len
        sizes["parameters"] = sum(t.numel() for t in p.model.parameters())
        info: dict[str, Any] = {
            "name": self.name,
            "job": self.job.name,
            "endpoint": f"/v1/{self.command}",
            "input": "image" if self.reads_images else "text",
            "folder": str(self.folder),
            "sizes": sizes,
        }
        languages = {k: getattr(settings, k, None) for k in ("source_lang", "target_lang")}
        if any(languages.values()):
            info["languages"] = {
                "source": languages["source_lang"],
                "target": languages["target_lang"],
            }
        if getattr(p, "labels", None) is not None:
            info["labels"] = list(p.labels.names)
        if self.reads_images:
            info["image"] = dataclasses.asdict(p.image)
        return info


def model_names(specs: Sequence[str]) -> list[tuple[str, Path]]:
    """``[NAME=]RUN`` specs -> (name, folder); the name defaults to the folder's name."""
    named: list[tuple[str, Path]] = []
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep:
            name, folder = Path(spec).name or spec, spec
        if not name or not folder:
            raise InputError(f"--model {spec!r}: give RUN or NAME=RUN")
        if any(name == other for other, _ in named):
            raise InputError(
                f"--model {spec}: two models are called {name!r}; name them with NAME=RUN"
            )
        named.append((name, Path(folder)))
    return named


def load_models(
    specs: Sequence[str],
    device: str | torch.device = "cpu",
    max_tokens: int = 4096,
    max_wait: float = 0.005,
) -> dict[str, HostedModel]:
    """Load every run folder once; a broken one is an ``InputError`` naming it."""
    hosted: dict[str, HostedModel] = {}
    for name, folder in model_names(specs):
        if not folder.is_dir():
            raise InputError(f"--model {folder}: no such run folder")
        predictor = load_run(folder, device)
        job = get_job(predictor.job)
        if job.predict_command not in RUNNERS:
            raise InputError(f"--model {folder}: the service cannot run a {job.name} run")
        runner = RUNNERS[job.predict_command]
        run: RunBatch = lambda key, inputs, p=predictor, r=runner: r(p, key, inputs)
        hosted[name] = HostedModel(name, folder, job, predictor, Batcher(run, max_tokens, max_wait))
    return hosted
