"""The run folder: weights in safetensors, config and metrics as text, training state for resume.

Every write goes to a temporary file in the same folder and is then renamed over the target,
so a crash leaves either the old file or the new one, never half of one.

A run folder holds:
    config.json          task name, ModelConfig, TrainConfig and the task's own settings
    model.safetensors    the weights to use (the best validation checkpoint)
    last.safetensors     the latest weights, with state.pt, for --resume
    state.pt             optimizer, scheduler, step, epoch, RNG states
    metrics.csv          one row per log step
    tokenizer.json ...   whatever the task needs to read its inputs
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from qkv.errors import InputError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
LAST_WEIGHTS = "last.safetensors"
STATE = "state.pt"
METRICS = "metrics.csv"
_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary path beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp's 0600 would hide run files from other users
    try:
        write(Path(tmp))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_weights(model: nn.Module, path: Path) -> None:
    """Weights as safetensors; tied matrices are stored once."""
    atomic_write(path, lambda tmp: save_model(model, str(tmp)))


def load_weights(model: nn.Module, path: Path) -> None:
    if not Path(path).is_file():
        raise InputError(f"{path}: no weights here; is this a qkv run folder?")
    missing, unexpected = load_model(model, str(path), strict=False)
    if unexpected or missing:
        raise InputError(
            f"{path}: the weights do not fit this model (missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}); was config.json changed?"
        )


def save_state(state: dict[str, Any], path: Path) -> None:
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_state(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The run folder's config.json, with one clear error when it is not a run folder."""
    path = Path(run_dir) / CONFIG
    if not Path(run_dir).is_dir():
        raise InputError(f"{run_dir}: no such run folder; pass the --out folder of `qkv train`")
    if not path.is_file():
        raise InputError(f"{path}: missing; {run_dir} is not a qkv run folder")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not valid JSON ({error}); the run folder is damaged") from None


def average_weights(paths: list[Path], model: nn.Module) -> None:
    """Load into ``model`` the mean of the weights saved at ``paths`` (checkpoint averaging)."""
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        load_weights(model, path)
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point():
                total[name] = total.get(name, 0) + tensor.double()
    model.load_state_dict(
        {name: (t / len(paths)).to(model.state_dict()[name].dtype) for name, t in total.items()},
        strict=False,
    )


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value


class MetricsLog:
    """metrics.csv, rewritten atomically on every row so a crash never leaves half a line."""

    def __init__(self, path: Path, metric_names: tuple[str, ...]) -> None:
        self.path = path
        self.columns = [
            "step",
            "epoch",
            "elapsed_s",
            "lr",
            "train_loss",
            "tokens_per_s",
            "val_loss",
            *[f"val_{m}" for m in metric_names if m != "loss"],
        ]
        self.rows: list[dict[str, Any]] = []

    def resume(self, step: int) -> None:
        """Keep the rows up to ``step``; later ones belong to the run being replaced."""
        if self.path.is_file():
            with open(self.path, newline="", encoding="utf-8") as f:
                self.rows = [r for r in csv.DictReader(f) if int(r["step"]) <= step]

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append({c: row.get(c, "") for c in self.columns})
        out = io.StringIO()
        writer = csv.DictWriter(out, self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        write_text(self.path, out.getvalue())
