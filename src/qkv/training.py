"""One training loop for every task: optimizer, schedule, precision, validation, checkpoints.

A task (translation, tagging, classification, ViT) supplies batches, a loss and a validation;
the ``Trainer`` does everything else the same way for all of them. It runs as it is under
``torchrun`` (DistributedDataParallel or FSDP, one process per device; see
``qkv.distributed``): each rank takes every world_size-th batch, and rank 0 validates and
writes the run folder.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn

from qkv import checkpoint as ckpt
from qkv.allocator import keep_freed_memory, release_freed_memory
from qkv.config import option
from qkv.distributed import Parallel, broadcast_flag, broadcast_number, setup_distributed
from qkv.errors import InputError
from qkv.precision import PRECISIONS, PrecisionChoice, choose_precision
from qkv.progress import TrainingProgress

STRATEGIES = ("ddp", "fsdp")
SCHEDULES = ("inverse_sqrt", "cosine")


@dataclass
class TrainConfig:
    """Settings of the training loop, the same for every job; config.json records them.

    What a batch holds, the loss and the data belong to the job's own settings.
    """

    out: str = option("runs/run", cli=False)  # the run folder; the command line's --out
    max_steps: int = option(20000, "stop after this many optimizer steps")
    max_time: float | None = option(
        None, "stop after this many seconds of training (validation included)"
    )
    max_epochs: int | None = option(None, "stop after this many passes over the training data")
    lr: float = option(7e-4, "peak learning rate, reached at the end of warmup")
    warmup_steps: int = option(4000, "steps of linear warmup before the decay")
    lr_schedule: str = option(
        "inverse_sqrt",
        "decay after warmup: inverse_sqrt (the paper's), or cosine down to 0 at --max-steps "
        "or at --max-time, whichever comes first",
        choices=SCHEDULES,
    )
    # Adam's betas and eps as in the paper (5.3); weight decay is AdamW's decoupled one.
    betas: tuple[float, float] = option((0.9, 0.98), cli=False)
    adam_eps: float = option(1e-9, cli=False)
    weight_decay: float = option(0.0, "AdamW's decoupled weight decay on weight matrices")
    clip_norm: float = option(1.0, "clip the gradient norm to this value (0 disables)")
    accumulate: int = option(1, "batches whose gradients are summed per optimizer step")
    precision: str = option(
        "auto",
        "auto: bf16 autocast where it measures faster than fp32 on this machine; bf16; fp32",
        choices=PRECISIONS,
    )
    seed: int = option(1, "random seed of initialisation, batch order and dropout")
    eval_every: int = option(1000, "validate and checkpoint every N steps")
    log_every: int = option(
        50, "write a metrics.csv row (and a progress line when not on a terminal) every N steps"
    )
    patience: int | None = option(None, "stop after N validations without improvement")
    max_nonfinite: int = option(
        5,
        "a step whose loss or gradient is NaN or inf is skipped; stop after this many in a row",
    )
    average_last: int = option(
        0, "at the end, average the weights of the last N checkpoints if that helps"
    )
    # ddp: every process holds the whole model (DistributedDataParallel); fsdp: parameters,
    # gradients and optimizer state are sharded across processes (FullyShardedDataParallel).
    strategy: str = option(
        "ddp",
        "under torchrun: ddp replicates the model per process; fsdp shards it (FSDP)",
        choices=STRATEGIES,
    )
    # torch.compile traces the training module into fused kernels: a slow first step (tens of
    # seconds), then faster steps where the model is large enough to pay for it.
    compile: bool = option(False, "compile the training module with torch.compile")
    progress: bool = option(True, cli=False)

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        checks = {
            "max_steps": self.max_steps >= 1,
            "max_time": self.max_time is None or self.max_time > 0,
            "max_epochs": self.max_epochs is None or self.max_epochs >= 1,
            "lr": self.lr > 0,
            "warmup_steps": self.warmup_steps >= 0,
            "lr_schedule": self.lr_schedule in SCHEDULES,
            "weight_decay": self.weight_decay >= 0,
            "clip_norm": self.clip_norm >= 0,
            "accumulate": self.accumulate >= 1,
            "eval_every": self.eval_every >= 1,
            "log_every": self.log_every >= 1,
            "patience": self.patience is None or self.patience >= 1,
            "precision": self.precision in PRECISIONS,
            "average_last": self.average_last >= 0,
            "max_nonfinite": self.max_nonfinite >= 1,
            "strategy": self.strategy in STRATEGIES,
        }
        bad = [f"{name}={getattr(self, name)!r}" for name, ok in checks.items() if not ok]
        if bad:
            raise InputError(f"invalid training settings: {', '.join(bad)}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


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


def cosine_schedule(
    warmup_steps: int,
    total_steps: int,
    max_time: float | None = None,
    elapsed: Callable[[], float] | None = None,
):
    """Linear warmup to 1, then half a cosine down to 0 at the end of the budget.

    After warmup the curve is at whichever budget is further spent: steps of ``total_steps``,
    or, with ``max_time``, ``elapsed()`` seconds of ``max_time``. A run bounded by time thus
    anneals to 0 as its time runs out, however many steps the machine manages; a run bounded
    by steps is a pure function of the step, and resumes on the same curve.
    """

    warmup = inverse_sqrt_schedule(warmup_steps)

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return warmup(step)
        progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
        if max_time is not None and elapsed is not None:
            progress = max(progress, elapsed() / max_time)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def learning_rate_schedule(config: TrainConfig, elapsed: Callable[[], float] | None = None):
    """The factor on ``config.lr`` at each optimizer step, by ``config.lr_schedule``.

    ``elapsed`` reads the run's training seconds, for a cosine that ends at ``max_time``.
    """
    if config.lr_schedule == "cosine":
        return cosine_schedule(config.warmup_steps, config.max_steps, config.max_time, elapsed)
    return inverse_sqrt_schedule(config.warmup_steps)


def shared_precision(
    requested: str, device: torch.device, model: nn.Module, rank: int, world: int
) -> PrecisionChoice:
    """Rank 0's precision, taken by every rank. Only rank 0 times ``--precision auto``: on one
    machine the other ranks would time the same layers on the same cores at the same moment,
    and on others their answer would be overruled by rank 0's anyway."""
    if rank == 0 or requested != "auto":
        choice = choose_precision(requested, device, model=model)
    else:
        choice = PrecisionChoice("fp32", "rank 0's choice")
    bf16 = broadcast_flag(choice.precision == "bf16", world, device)
    if bf16 != (choice.precision == "bf16"):  # every rank computes as rank 0 does
        choice = PrecisionChoice("bf16" if bf16 else "fp32", "rank 0's choice")
    return choice


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
    # The fused kernel updates every parameter in one pass instead of a loop of small ops;
    # sharded (FSDP) parameters take the default multi-tensor path.
    fused = all(
        type(p) is nn.Parameter and p.device.type in ("cpu", "cuda") for p in params.values()
    )
    return torch.optim.AdamW(
        groups, lr=config.lr, betas=config.betas, eps=config.adam_eps, fused=fused or None
    )


class Trainer:
    """Trains ``model`` on ``task`` into the run folder ``config.out``.

    Args:
        task: the job's batches, loss and validation.
        model: a freshly built model (or the same model again, with ``resume=True``).
        config: training settings.
        run_config: what config.json records besides the training settings (job, model).
        resume: continue from ``last.safetensors`` and ``state.pt`` exactly where they stopped.
        device: where to train (default: this process's GPU if any, else the CPU).
    """

    def __init__(
        self,
        task: Task,
        model: nn.Module,
        config: TrainConfig,
        run_config: dict[str, Any],
        resume: bool = False,
        device: str | torch.device | None = None,
    ) -> None:
        self.task, self.config = task, config
        self.run_dir = Path(config.out)
        self.rank, self.world, self.device = setup_distributed(device)
        if self.device.type == "cpu":  # each step reuses the last one's memory, unfaulted
            keep_freed_memory()
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        model = model.to(self.device)
        state = self._read_resume_state(model) if resume else None
        self.parallel = Parallel(model, config.strategy, self.world, self.device)
        self.model, self.train_module = self.parallel.model, self.parallel.train_module
        if config.compile:
            self.train_module = torch.compile(self.train_module, dynamic=True)
        self.optimizer = configure_optimizer(self.train_module, config)
        # The run's clock as rank 0 reads it: every rank decays and stops on the same reading.
        self.start, self.elapsed_before, self.clock = time.monotonic(), 0.0, 0.0
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, learning_rate_schedule(config, lambda: self.clock)
        )
        self.precision = shared_precision(
            config.precision, self.device, self.model, self.rank, self.world
        )
        self.amp_dtype = self.precision.autocast_dtype
        self.log = ckpt.MetricsLog(self.run_dir / ckpt.METRICS, task.metric_names)
        self.step = self.epoch = self.batch_index = 0
        self.best: float | None = None
        self.best_loss: float | None = None  # breaks ties of the metric (see beats)
        self.bad_evals, self.tokens_seen = 0, 0
        self.saved: list[Path] = []
        self.skipped_steps = self.nonfinite_in_row = self._last_saved_step = 0
        self.tensorboard = self._tensorboard()
        if state is not None:
            self._resume(state)
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
        self.start = time.monotonic()
        wall_start = time.monotonic()
        self.progress = TrainingProgress(
            config.progress and self.is_main,
            f"train {self.task.name}",
            config.max_steps,
            config.max_time,
            self.step,
            self.elapsed_before,
            config.log_every,
        )
        self.progress.write(f"precision {self.precision.precision}: {self.precision.reason}")
        window_loss, window_tokens, window_start = 0.0, 0, time.monotonic()
        reason = "max_steps"
        while self.step < config.max_steps:
            if config.max_epochs is not None and self.epoch >= config.max_epochs:
                reason = "max_epochs"
                break
            batches = self._epoch_batches()
            if len(batches) < config.accumulate:
                raise InputError(
                    f"the training data fills {self._epoch_total} batches, fewer than "
                    f"{self.world * config.accumulate} (processes x --accumulate) for one step; "
                    "lower the batch size or give more data"
                )
            if self.batch_index + config.accumulate > len(batches):
                self.epoch, self.batch_index = self.epoch + 1, 0
                continue
            loss, tokens = self._train_step(batches)
            if tokens < 0:  # skipped: the loss or the gradient was not finite
                continue
            window_loss, window_tokens = window_loss + loss, window_tokens + tokens
            if self.step % config.log_every == 0:
                rate = window_tokens * self.world / max(time.monotonic() - window_start, 1e-9)
                self._log_train(window_loss / config.log_every, rate)
                window_loss, window_tokens, window_start = 0.0, 0, time.monotonic()
            self.progress.update(self.step, self.elapsed())
            if self.step % config.eval_every == 0 and self._validate_and_save():
                reason = "early_stopping"
                break
            if config.max_time is not None and self.clock >= config.max_time:
                reason = "max_time"
                break
        self.progress.close()
        self.wall_seconds = time.monotonic() - wall_start
        return self._finish(reason)

    def elapsed(self) -> float:
        """Wall-clock seconds of training so far, earlier runs of a resume included."""
        return self.elapsed_before + time.monotonic() - self.start

    def _epoch_batches(self) -> list[Any]:
        if getattr(self, "_batches_epoch", None) != self.epoch:
            batches = self.task.train_batches(self.epoch, self.config.seed)
            self._epoch_total = len(batches)
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
        self.train_module.train()
        total_loss, total_tokens = 0.0, 0
        for micro in range(self.config.accumulate):
            batch = _to_device(batches[self.batch_index], self.device)
            self.batch_index += 1
            with self.parallel.no_sync(last=micro == self.config.accumulate - 1):
                with self._autocast():
                    loss, tokens = self.task.loss(self.train_module, batch)
                (loss / self.config.accumulate).backward()
            total_loss += loss.item() / self.config.accumulate
            total_tokens += tokens
        # The norm is taken over the averaged gradients, so every rank sees the same value.
        norm = nn.utils.clip_grad_norm_(
            self.train_module.parameters(), self.config.clip_norm or math.inf
        )
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP: DTensor
        # Every rank decides on the shared norm; a single process may also go by its loss.
        if not torch.isfinite(norm).item() or (self.world == 1 and not math.isfinite(total_loss)):
            return self._skip_step(total_loss)
        self.nonfinite_in_row = 0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.config.max_time is not None:  # one reading per step, for the decay and the stop
            self.clock = broadcast_number(self.elapsed(), self.world, self.device)
        self.scheduler.step()
        self.step += 1
        self.tokens_seen += total_tokens * self.world
        return total_loss, total_tokens

    def _skip_step(self, loss: float) -> tuple[float, int]:
        """Drop this step's gradients; after ``max_nonfinite`` in a row, stop training."""
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped_steps += 1
        self.nonfinite_in_row += 1
        self.progress.write(f"step {self.step + 1}: loss {loss}, not finite; the step is skipped")
        if self.nonfinite_in_row >= self.config.max_nonfinite:
            kept = (
                f"the last checkpoint (step {self._last_saved_step}) in {self.run_dir} is intact"
                if self._last_saved_step
                else "no checkpoint was saved yet"
            )
            raise InputError(
                f"training stopped at step {self.step}: {self.nonfinite_in_row} steps in a row "
                f"had a loss or gradient that is not finite; {kept}. Lower --lr, raise "
                "--warmup-steps or train with --precision fp32"
            )
        return loss, -1

    def _log_train(self, loss: float, tokens_per_s: float) -> None:
        lr = self.scheduler.get_last_lr()[0]
        self.progress.postfix = {
            "loss": f"{loss:.3f}",
            "lr": f"{lr:.2e}",
            "tok/s": f"{tokens_per_s:,.0f}",
        }
        if self.is_main:
            self.log.add(
                {
                    "step": self.step,
                    "epoch": self.epoch,
                    "lr": f"{lr:.6g}",
                    "elapsed_s": f"{self.elapsed():.1f}",
                    "train_loss": f"{loss:.4f}",
                    "tokens_per_s": f"{tokens_per_s:.0f}",
                    "skipped_steps": self.skipped_steps,
                }
            )
            if self.tensorboard:
                self.tensorboard.add_scalar("train/loss", loss, self.step)
                self.tensorboard.add_scalar("train/lr", lr, self.step)

    # -- validation and checkpoints ------------------------------------------------------------

    def _validate_and_save(self) -> bool:
        """Validate, keep the best weights, save state for resume; True to stop early."""
        stop = False
        self.parallel.gather()  # FSDP: the whole model on rank 0 (every rank takes part)
        optimizer_state = self.parallel.optimizer_state(self.optimizer)
        if self.is_main:
            metrics = self._validate()
            value = metrics[self.task.metric]
            if beats(metrics, self.task.metric, (self.best, self.best_loss)):
                self.best, self.best_loss, self.bad_evals = value, metrics.get("loss"), 0
                ckpt.save_weights(self.model, self.run_dir / ckpt.WEIGHTS)
            else:
                self.bad_evals += 1
            self._save_for_average()
            self._save_resume_state(optimizer_state)
            self._prune_averaged()
            patience = self.config.patience
            stop = patience is not None and self.bad_evals >= patience
        if self.device.type == "cpu":  # the heap's holes since the last validation
            release_freed_memory()
        return broadcast_flag(stop, self.world, self.device)

    def _validate(self, note: str = "") -> dict[str, float]:
        """Validate and log; ``note`` marks a row after the loop stopped (``ckpt.AFTER_LOOP``)."""
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
                "note": note,
            }
        )
        if self.tensorboard and note != ckpt.AVERAGED:  # as the curves: the average is no point
            for k, v in metrics.items():
                self.tensorboard.add_scalar(f"val/{k}", v, self.step)
        self.progress.write(
            f"step {self.step}{f' ({note})' if note else ''}: "
            + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        )
        return metrics

    def _save_for_average(self) -> None:
        if self.config.average_last <= 0:
            return
        path = self.run_dir / "checkpoints" / f"step_{self.step}.safetensors"
        ckpt.save_weights(self.model, path)
        self.saved.append(path)

    def _prune_averaged(self) -> None:
        """Delete checkpoints no longer averaged, only once state.pt no longer lists them."""
        if self.config.average_last <= 0:
            return
        for old in self.saved[: -self.config.average_last]:
            old.unlink(missing_ok=True)
        self.saved = self.saved[-self.config.average_last :]

    def _save_resume_state(self, optimizer_state: dict[str, Any]) -> None:
        """state.pt is the commit point of a checkpoint: a crash before its rename resumes
        from the previous one, whose files are all still there."""
        ckpt.save_state(
            {
                "step": self.step,
                "model": self.model.state_dict(),
                "epoch": self.epoch,
                "batch_index": self.batch_index,
                "best": self.best,
                "best_loss": self.best_loss,
                "bad_evals": self.bad_evals,
                "elapsed": self.elapsed(),
                "tokens_seen": self.tokens_seen,
                "skipped_steps": self.skipped_steps,
                "saved": [str(p) for p in self.saved[-max(self.config.average_last, 1) :]],
                "optimizer": optimizer_state,
                "scheduler": self.scheduler.state_dict(),
                "rng": ckpt.rng_state(),
            },
            self.run_dir / ckpt.STATE,
        )
        ckpt.save_weights(self.model, self.run_dir / ckpt.LAST_WEIGHTS)
        self._last_saved_step = self.step

    def _read_resume_state(self, model: nn.Module) -> dict[str, Any]:
        """Load state.pt's weights into ``model`` (before it is wrapped) and return the state."""
        state_path = self.run_dir / ckpt.STATE
        if not state_path.is_file():
            raise InputError(f"{state_path}: nothing to resume; train without --resume first")
        state = ckpt.load_state(state_path)
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as error:
            first = str(error).strip().splitlines()[0]
            raise InputError(
                f"{state_path}: its weights do not fit this model ({first}); "
                "was config.json changed?"
            ) from None
        return state

    def _resume(self, state: dict[str, Any]) -> None:
        self.parallel.load_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.epoch, self.batch_index = (
            state["step"],
            state["epoch"],
            state["batch_index"],
        )
        self.best, self.bad_evals = state["best"], state["bad_evals"]
        self.best_loss = state.get("best_loss")
        self.elapsed_before, self.tokens_seen = state["elapsed"], state["tokens_seen"]
        self.clock = self.elapsed_before
        self.skipped_steps = state.get("skipped_steps", 0)
        self._last_saved_step = self.step
        self.saved = [Path(p) for p in state["saved"]]
        ckpt.set_rng_state(state["rng"])
        self.log.resume(self.step)
        kept = self.run_dir / ckpt.LOOP_BEST
        if self.is_main and kept.is_file():  # an earlier finish replaced the loop's best
            os.replace(kept, self.run_dir / ckpt.WEIGHTS)

    def _finish(self, reason: str) -> dict[str, Any]:
        """Checkpoint where the loop stopped, then give the user the best weights it can.

        The steps since the last validation are validated and the last checkpoints averaged;
        either replaces model.safetensors if it validates better. These validations are
        outside the loop: the resume state is saved before them, their metrics.csv rows are
        marked ``final`` (the last step's own weights) and ``averaged``, and a resume drops
        them and puts the loop's own best weights back, so that a run stopped and resumed
        continues exactly as if it had never stopped.
        """
        final_best = (self.best, self.best_loss)
        if self.step % self.config.eval_every != 0:
            self.parallel.gather()
            optimizer_state = self.parallel.optimizer_state(self.optimizer)
            if self.is_main:
                self._save_resume_state(optimizer_state)
                final_best = self._keep_if_better(self._validate(ckpt.FINAL), final_best)
        averaged = False
        if self.is_main and len(self.saved) > 1:
            ckpt.average_weights(self.saved, self.model)
            before = final_best
            final_best = self._keep_if_better(self._validate(ckpt.AVERAGED), final_best)
            averaged = final_best != before
        if self.world > 1:  # every rank reports the same summary
            shared = [final_best, averaged]
            dist.broadcast_object_list(shared, src=0)
            final_best, averaged = shared
            dist.barrier()
        if self.is_main:
            ckpt.load_weights(self.model, self.run_dir / ckpt.WEIGHTS)
        if self.tensorboard:
            self.tensorboard.close()
        return {
            "task": self.task.name,
            "steps": self.step,
            "epochs": self.epoch,
            "stopped_by": reason,
            "wall_seconds": round(self.wall_seconds, 1),
            "world_size": self.world,
            "precision": self.precision.precision,
            "precision_reason": self.precision.reason,
            "train_seconds": round(self.elapsed(), 1),
            "tokens_per_second": round(self.tokens_seen / max(self.elapsed(), 1e-9), 1),
            f"best_val_{self.task.metric}": final_best[0],
            "averaged_checkpoints": averaged,
            "skipped_steps": self.skipped_steps,
        }

    def _keep_if_better(self, metrics: dict[str, float], best: Best) -> Best:
        """Save the model as model.safetensors if it beats ``best``; return the new best.

        The loop's best weights are first set aside in checkpoints/, for a resume.
        """
        if not beats(metrics, self.task.metric, best):
            return best
        weights, kept = self.run_dir / ckpt.WEIGHTS, self.run_dir / ckpt.LOOP_BEST
        if weights.is_file() and not kept.is_file():
            kept.parent.mkdir(parents=True, exist_ok=True)
            os.replace(weights, kept)
        ckpt.save_weights(self.model, weights)
        return metrics[self.task.metric], metrics.get("loss")


# The best validation so far: the task's metric and the loss with it (None before the first).
Best = tuple[float | None, float | None]


def beats(metrics: dict[str, float], metric: str, best: Best) -> bool:
    """Whether a validation beats ``best``: a higher metric, or the same with a lower loss.

    On a few hundred validation items an accuracy moves in coarse steps and ties are common
    (a ViT on 179 digits reaches the same 98.88% at many checkpoints); the loss, a finer
    measure of the same items, then picks the one that fits them best.
    """
    value, best_value, best_loss = metrics[metric], best[0], best[1]
    if best_value is None or value > best_value:
        return True
    loss = metrics.get("loss")
    return value == best_value and loss is not None and best_loss is not None and loss < best_loss


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
