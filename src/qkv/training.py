"""One training loop for every task: optimizer, schedule, precision, validation, checkpoints.

A task (translation, tagging, classification, ViT) supplies batches, a loss and a validation;
the ``Trainer`` does everything else the same way for all of them. It runs as it is under
``torchrun`` (DistributedDataParallel, one process per device): each rank takes every
world_size-th batch, and rank 0 validates and writes the run folder.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm.auto import tqdm

from qkv import checkpoint as ckpt
from qkv.distributed import broadcast_flag, setup_distributed
from qkv.errors import InputError

PRECISIONS = ("auto", "bf16", "fp32")


@dataclass
class TrainConfig:
    """Training settings; the command line builds one, and config.json records it."""

    out: str = "runs/run"
    max_steps: int = 20000
    max_time: float | None = None  # seconds, validation included; stops cleanly with a checkpoint
    # "wall": max_time is wall-clock time. "cpu": the process's CPU time divided by its threads,
    # i.e. the time it had the whole machine, so a budget holds on a machine others share.
    clock: str = "wall"
    max_epochs: int | None = None
    lr: float = 7e-4  # peak learning rate, reached at the end of warmup
    warmup_steps: int = 4000
    # Adam's betas and eps as in the paper (5.3); weight decay is AdamW's decoupled one.
    betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0  # 0 disables gradient clipping
    accumulate: int = 1  # batches per optimizer step
    max_tokens: int = 4096  # tokens per batch (padding included), not sentences
    precision: str = "auto"  # bf16 autocast where the device supports it, else fp32
    seed: int = 1
    eval_every: int = 1000
    log_every: int = 50
    patience: int | None = None  # validations without improvement before stopping early
    average_last: int = 0  # average the weights of the last N validation checkpoints at the end
    progress: bool = True

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        checks = {
            "max_steps": self.max_steps >= 1,
            "lr": self.lr > 0,
            "warmup_steps": self.warmup_steps >= 0,
            "label_smoothing": 0 <= self.label_smoothing < 1,
            "accumulate": self.accumulate >= 1,
            "max_tokens": self.max_tokens >= 1,
            "eval_every": self.eval_every >= 1,
            "log_every": self.log_every >= 1,
            "precision": self.precision in PRECISIONS,
            "clock": self.clock in ("wall", "cpu"),
            "average_last": self.average_last >= 0,
        }
        bad = [f"{name}={getattr(self, name)!r}" for name, ok in checks.items() if not ok]
        if bad:
            raise InputError(f"invalid training settings: {', '.join(bad)}")


class Task(Protocol):
    """What a job must provide to be trained by the ``Trainer``."""

    name: str
    metric: str  # validation metric that picks the best checkpoint (higher is better)
    metric_names: tuple[str, ...]  # validation columns of metrics.csv, ``metric`` among them

    def train_batches(self, epoch: int, seed: int) -> list[Any]: ...
    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, int]: ...
    def validate(self, model: nn.Module) -> dict[str, float]: ...


def inverse_sqrt_schedule(warmup_steps: int):
    """Linear warmup to 1, then decay as sqrt(warmup / step) (the paper's shape, 5.3)."""

    def factor(step: int) -> float:
        step = max(step, 1)
        if warmup_steps and step < warmup_steps:
            return step / warmup_steps
        return math.sqrt(max(warmup_steps, 1) / step)

    return factor


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 for autocast, or None for fp32."""
    if precision == "fp32":
        return None
    if precision == "bf16" or bf16_supported(device):
        return torch.bfloat16
    return None


def configure_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; every parameter in exactly one group."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    decay = [p for name, p in params.items() if p.dim() >= 2 and "position" not in name]
    no_decay = [p for name, p in params.items() if p.dim() < 2 or "position" in name]
    assert len({id(p) for p in decay} | {id(p) for p in no_decay}) == len(
        {id(p) for p in params.values()}
    ), "a parameter is in no group or in both"
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.adam_eps)


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
        ckpt.write_text(self.path, out.getvalue())


class Trainer:
    """Trains ``model`` on ``task`` into the run folder ``config.out``.

    Args:
        task: the job's batches, loss and validation.
        model: a freshly built model (or the same model again, with ``resume=True``).
        config: training settings.
        run_config: what config.json records besides the training settings (task, model).
        resume: continue from ``last.safetensors`` and ``state.pt`` exactly where they stopped.
    """

    def __init__(
        self,
        task: Task,
        model: nn.Module,
        config: TrainConfig,
        run_config: dict[str, Any],
        resume: bool = False,
    ) -> None:
        self.task, self.config = task, config
        self.run_dir = Path(config.out)
        self.rank, self.world, self.device = setup_distributed()
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        self.model = model.to(self.device)
        self.ddp = nn.parallel.DistributedDataParallel(self.model) if self.world > 1 else self.model
        self.optimizer = configure_optimizer(self.model, config)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, inverse_sqrt_schedule(config.warmup_steps)
        )
        self.amp_dtype = autocast_dtype(config.precision, self.device)
        self.log = MetricsLog(self.run_dir / ckpt.METRICS, task.metric_names)
        self.step = self.epoch = self.batch_index = 0
        self.best: float | None = None
        self.bad_evals, self.elapsed_before, self.tokens_seen = 0, 0.0, 0
        self.saved: list[Path] = []
        self.tensorboard = self._tensorboard()
        if resume:
            self._resume()
        elif self.is_main:
            ckpt.write_json(
                self.run_dir / ckpt.CONFIG, {**run_config, "train": dataclasses.asdict(config)}
            )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _tensorboard(self):
        if not self.is_main:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            return None
        return SummaryWriter(str(self.run_dir / "tensorboard"))

    # -- the loop ----------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        """Train until max_steps, max_time, max_epochs or early stopping; return the summary."""
        config = self.config
        self.start = self._clock()
        wall_start = time.monotonic()
        bar = tqdm(
            total=config.max_steps,
            initial=self.step,
            unit="step",
            disable=not (config.progress and self.is_main),
            dynamic_ncols=True,
            desc=f"train {self.task.name}",
        )
        window_loss, window_tokens, window_start = 0.0, 0, time.monotonic()
        reason = "max_steps"
        while self.step < config.max_steps:
            if config.max_epochs is not None and self.epoch >= config.max_epochs:
                reason = "max_epochs"
                break
            batches = self._epoch_batches()
            if self.batch_index + config.accumulate > len(batches):
                self.epoch, self.batch_index = self.epoch + 1, 0
                continue
            loss, tokens = self._train_step(batches)
            window_loss, window_tokens = window_loss + loss, window_tokens + tokens
            bar.update(1)
            if self.step % config.log_every == 0:
                rate = window_tokens * self.world / max(time.monotonic() - window_start, 1e-9)
                self._log_train(bar, window_loss / config.log_every, rate)
                window_loss, window_tokens, window_start = 0.0, 0, time.monotonic()
            if self.step % config.eval_every == 0 and self._validate_and_save():
                reason = "early_stopping"
                break
            if config.max_time is not None and self.elapsed() >= config.max_time:
                reason = "max_time"
                break
        bar.close()
        self.wall_seconds = time.monotonic() - wall_start
        return self._finish(reason)

    def elapsed(self) -> float:
        """Seconds of training so far, on ``config.clock``, earlier runs of a resume included."""
        return self.elapsed_before + self._clock() - self.start

    def _clock(self) -> float:
        if self.config.clock == "cpu":
            return time.process_time() / torch.get_num_threads()
        return time.monotonic()

    def _epoch_batches(self) -> list[Any]:
        if getattr(self, "_batches_epoch", None) != self.epoch:
            batches = self.task.train_batches(self.epoch, self.config.seed)
            per_rank = len(batches) // self.world  # every rank takes the same number of steps
            self._batches = batches[self.rank : per_rank * self.world : self.world]
            self._batches_epoch = self.epoch
        return self._batches

    def _autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _train_step(self, batches: list[Any]) -> tuple[float, int]:
        """One optimizer step over ``accumulate`` batches; returns (mean loss, target tokens)."""
        self.ddp.train()
        total_loss, total_tokens = 0.0, 0
        for micro in range(self.config.accumulate):
            batch = _to_device(batches[self.batch_index], self.device)
            self.batch_index += 1
            last = micro == self.config.accumulate - 1
            sync = nullcontext() if last or self.world == 1 else self.ddp.no_sync()
            with sync:
                with self._autocast():
                    loss, tokens = self.task.loss(self.ddp, batch)
                (loss / self.config.accumulate).backward()
            total_loss += loss.item() / self.config.accumulate
            total_tokens += tokens
        if self.config.clip_norm > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        self.tokens_seen += total_tokens * self.world
        return total_loss, total_tokens

    def _log_train(self, bar: tqdm, loss: float, tokens_per_s: float) -> None:
        lr = self.scheduler.get_last_lr()[0]
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}")
        if self.is_main:
            self.log.add(
                {
                    "step": self.step,
                    "epoch": self.epoch,
                    "lr": f"{lr:.6g}",
                    "elapsed_s": f"{self.elapsed():.1f}",
                    "train_loss": f"{loss:.4f}",
                    "tokens_per_s": f"{tokens_per_s:.0f}",
                }
            )
            if self.tensorboard:
                self.tensorboard.add_scalar("train/loss", loss, self.step)
                self.tensorboard.add_scalar("train/lr", lr, self.step)

    # -- validation and checkpoints ------------------------------------------------------------

    def _validate_and_save(self) -> bool:
        """Validate, keep the best weights, save state for resume; True to stop early."""
        stop = False
        if self.is_main:
            metrics = self._validate()
            value = metrics[self.task.metric]
            if self.best is None or value > self.best:
                self.best, self.bad_evals = value, 0
                ckpt.save_weights(self.model, self.run_dir / ckpt.WEIGHTS)
            else:
                self.bad_evals += 1
            self._save_for_average()
            self._save_resume_state()
            patience = self.config.patience
            stop = patience is not None and self.bad_evals >= patience
        return broadcast_flag(stop, self.world, self.device)

    def _validate(self) -> dict[str, float]:
        self.model.eval()
        with torch.no_grad(), self._autocast():
            metrics = self.task.validate(self.model)
        self.model.train()
        self.log.add(
            {
                "step": self.step,
                "epoch": self.epoch,
                "elapsed_s": f"{self.elapsed():.1f}",
                **{f"val_{k}": f"{v:.4f}" for k, v in metrics.items()},
            }
        )
        if self.tensorboard:
            for k, v in metrics.items():
                self.tensorboard.add_scalar(f"val/{k}", v, self.step)
        tqdm.write(f"step {self.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        return metrics

    def _save_for_average(self) -> None:
        if self.config.average_last <= 0:
            return
        path = self.run_dir / "checkpoints" / f"step_{self.step}.safetensors"
        ckpt.save_weights(self.model, path)
        self.saved.append(path)
        for old in self.saved[: -self.config.average_last]:
            old.unlink(missing_ok=True)
        self.saved = self.saved[-self.config.average_last :]

    def _save_resume_state(self) -> None:
        ckpt.save_weights(self.model, self.run_dir / ckpt.LAST_WEIGHTS)
        ckpt.save_state(
            {
                "step": self.step,
                "epoch": self.epoch,
                "batch_index": self.batch_index,
                "best": self.best,
                "bad_evals": self.bad_evals,
                "elapsed": self.elapsed(),
                "tokens_seen": self.tokens_seen,
                "saved": [str(p) for p in self.saved],
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": rng_state(),
            },
            self.run_dir / ckpt.STATE,
        )

    def _resume(self) -> None:
        state_path = self.run_dir / ckpt.STATE
        if not state_path.is_file():
            raise InputError(f"{state_path}: nothing to resume; train without --resume first")
        ckpt.load_weights(self.model, self.run_dir / ckpt.LAST_WEIGHTS)
        state = ckpt.load_state(state_path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.epoch, self.batch_index = (
            state["step"],
            state["epoch"],
            state["batch_index"],
        )
        self.best, self.bad_evals = state["best"], state["bad_evals"]
        self.elapsed_before, self.tokens_seen = state["elapsed"], state["tokens_seen"]
        self.saved = [Path(p) for p in state["saved"]]
        set_rng_state(state["rng"])
        self.log.resume(self.step)

    def _finish(self, reason: str) -> dict[str, Any]:
        """Validate the last steps too, average checkpoints if asked, and write the summary."""
        if self.step % self.config.eval_every != 0:
            self._validate_and_save()
        averaged = False
        if self.is_main and len(self.saved) > 1:
            averaged = self._try_average()
        if self.world > 1:  # every rank reports the same summary
            shared = [self.best, averaged]
            dist.broadcast_object_list(shared, src=0)
            self.best, averaged = shared
            dist.barrier()
        ckpt.load_weights(self.model, self.run_dir / ckpt.WEIGHTS)
        if self.tensorboard:
            self.tensorboard.close()
        return {
            "task": self.task.name,
            "steps": self.step,
            "epochs": self.epoch,
            "stopped_by": reason,
            "clock": self.config.clock,
            "wall_seconds": round(self.wall_seconds, 1),
            "world_size": self.world,
            "train_seconds": round(self.elapsed(), 1),
            "tokens_per_second": round(self.tokens_seen / max(self.elapsed(), 1e-9), 1),
            f"best_val_{self.task.metric}": self.best,
            "averaged_checkpoints": averaged,
        }

    def _try_average(self) -> bool:
        """Average the last checkpoints; keep the average only if it validates better."""
        ckpt.average_weights(self.saved, self.model)
        metrics = self._validate()
        if metrics[self.task.metric] > (self.best or -math.inf):
            self.best = metrics[self.task.metric]
            ckpt.save_weights(self.model, self.run_dir / ckpt.WEIGHTS)
            return True
        return False


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if dataclasses.is_dataclass(batch):
        return type(batch)(
            **{
                f.name: _to_device(getattr(batch, f.name), device)
                for f in dataclasses.fields(batch)
            }
        )
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch
