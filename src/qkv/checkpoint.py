"""The run folder: weights in safetensors, config and metrics as text, training state for resume.

Every write goes to a temporary file in the same folder and is then renamed over the target,
so a crash leaves either the old file or the new one, never half of one.

A run folder holds:
    config.json          task name, ModelConfig, TrainConfig and the task's own settings
    model.safetensors    the weights to use (the best validation checkpoint)
    state.pt             for --resume: the latest weights, optimizer, scheduler, step, data
                         position, RNG states, in one file, so they are replaced together
    last.safetensors     the latest weights alone, a copy of those in state.pt
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
LOOP_BEST = "checkpoints/loop_best.safetensors"  # set aside while a finished run's average wins
METRICS = "metrics.csv"
# metrics.csv notes of the validations after the loop stopped: the last step's own weights and
# the last checkpoints averaged. A resume drops these rows; the loop validates again.
FINAL, AVERAGED = "final", "averaged"
AFTER_LOOP = (FINAL, AVERAGED)
STATE_KEYS = {"step", "epoch", "batch_index", "model", "optimizer", "scheduler", "rng"}
_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary path beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        # After writing: mkstemp's 0600 (kept by writers that replace the file, such as
        # safetensors) would hide run files from other users.
        os.chmod(tmp, 0o666 & ~_UMASK)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:  # a full disk, a folder made read-only meanwhile, ...
        Path(tmp).unlink(missing_ok=True)
        kept = "the previous version is intact" if path.exists() else "nothing was written"
        raise InputError(
            f"{path}: could not be written ({error.strerror or error}); {kept}"
        ) from None
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
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except RuntimeError as error:  # shapes of another model size
        first = str(error).strip().splitlines()[-1].strip()
        raise InputError(
            f"{path}: the weights do not fit this model ({first}); was config.json changed?"
        ) from None
    except Exception as error:  # SafetensorError: truncated or not safetensors at all
        raise InputError(
            f"{path}: not a readable safetensors file ({error}); the file is damaged"
        ) from None
    if unexpected or missing:
        raise InputError(
            f"{path}: the weights do not fit this model (missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}); was config.json changed?"
        )


def save_state(state: dict[str, Any], path: Path) -> None:
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_state(path: Path) -> dict[str, Any]:
    """state.pt, read with ``weights_only=True``: nothing in a run folder is unpickled freely."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated, not a torch file, or unsafe to unpickle
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"{path}: not a readable training state ({first})") from None
    if not isinstance(state, dict) or not STATE_KEYS <= state.keys():
        raise InputError(f"{path}: not a qkv training state (keys missing); the file is damaged")
    return state


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
    """metrics.csv, one appended and fsync'd line per row.

    A crash can tear only the last line; ``resume`` drops it along with rows later than the
    checkpoint being resumed.
    """

    def __init__(self, path: Path, metric_names: tuple[str, ...]) -> None:
        self.path = path
        self.columns = [
            "step",
            "epoch",
            "elapsed_s",
            "lr",
            "train_loss",
            "tokens_per_s",
            "skipped_steps",
            "val_loss",
            *[f"val_{m}" for m in metric_names if m != "loss"],
            "note",  # empty in the loop; after it, one of AFTER_LOOP
        ]
        self.started = False

    def resume(self, step: int) -> None:
        """Keep the complete rows up to ``step``; later ones belong to the run being replaced."""
        kept: list[dict[str, Any]] = []
        if self.path.is_file():
            text = self.path.read_text(encoding="utf-8", errors="replace")
            complete = text[: text.rfind("\n") + 1]  # a torn last line has no newline
            try:
                rows = list(csv.DictReader(io.StringIO(complete)))
            except csv.Error:
                rows = [{}]  # reported below
            for row in rows:
                try:
                    if int(row["step"]) <= step and row.get("note") not in AFTER_LOOP:
                        kept.append(row)
                except (KeyError, TypeError, ValueError):
                    raise InputError(
                        f"{self.path}: row {len(kept) + 2} is not a metrics row; the file is "
                        "damaged (move it away to resume without it)"
                    ) from None
        self._rewrite(kept)

    def add(self, row: dict[str, Any]) -> None:
        if not self.started:
            self._rewrite([])
        out = io.StringIO()
        csv.DictWriter(out, self.columns, lineterminator="\n").writerow(
            {c: row.get(c, "") for c in self.columns}
        )
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(out.getvalue())
                f.flush()
                os.fsync(f.fileno())
        except OSError as error:
            raise InputError(
                f"{self.path}: could not be written ({error.strerror or error}); the rows "
                "before are intact"
            ) from None

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        out = io.StringIO()
        writer = csv.DictWriter(
            out, self.columns, lineterminator="\n", extrasaction="ignore", restval=""
        )
        writer.writeheader()
        writer.writerows(rows)
        write_text(self.path, out.getvalue())
        self.started = True
