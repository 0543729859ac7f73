"""A damaged or mismatched run folder gives one line naming the file and what is wrong, exit 2.

Also: nothing in a run folder is unpickled freely, files are written with the user's umask,
a full disk leaves the previous checkpoint loadable, and a non-finite loss skips the step.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from qkv import checkpoint as ckpt
from qkv.errors import InputError
from qkv.training import Trainer

from .helpers import train_tiny_translation, train_translation_args, write_splits
from .viz.conftest import TRANSLATION_OPTIONS, qkv, translation_run  # noqa: F401 (a fixture)


@pytest.fixture
def run(translation_run, tmp_path) -> Path:  # noqa: F811 (the imported fixture)
    """A copy of a trained tiny translator, free to damage."""
    copy = tmp_path / "run"
    shutil.copytree(translation_run, copy)
    return copy


def one_line_error(capsys, *argv) -> str:
    assert qkv(*argv) == 2
    said = capsys.readouterr().err
    assert said.startswith("qkv: error:") and said.count("\n") == 1, said
    return said


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:20])


def test_truncated_weights(run, capsys):
    truncate(run / ckpt.WEIGHTS)
    said = one_line_error(capsys, "translate", "--model", run, "--input", os.devnull)
    assert "model.safetensors" in said and "damaged" in said


def test_a_damaged_tokenizer(run, capsys):
    (run / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    said = one_line_error(capsys, "translate", "--model", run, "--input", os.devnull)
    assert "tokenizer.json" in said


def test_a_damaged_config(run, capsys):
    (run / ckpt.CONFIG).write_text("{ half")
    said = one_line_error(capsys, "translate", "--model", run, "--input", os.devnull)
    assert "config.json" in said and "JSON" in said


def test_a_config_of_another_model_size(run, capsys):
    config = json.loads((run / ckpt.CONFIG).read_text())
    config["model"]["d_model"] *= 2
    (run / ckpt.CONFIG).write_text(json.dumps(config))
    said = one_line_error(capsys, "translate", "--model", run, "--input", os.devnull)
    assert "model.safetensors" in said and "do not fit" in said


def test_a_run_of_another_job(run, capsys):
    said = one_line_error(capsys, "tag", "--model", run, "--input", os.devnull)
    assert "'translation' run" in said


def test_damaged_metrics(run, capsys):
    (run / ckpt.METRICS).write_bytes(b"step,train_loss\n1,\x00oops\n")
    said = one_line_error(capsys, "plot", run)
    assert "metrics.csv" in said


def resume_args(run: Path, tmp_path: Path) -> list[object]:
    return train_translation_args(write_splits(tmp_path), run, *TRANSLATION_OPTIONS, "--resume")


def test_a_truncated_training_state(run, tmp_path, capsys):
    truncate(run / ckpt.STATE)
    said = one_line_error(capsys, *resume_args(run, tmp_path))
    assert "state.pt" in said and "not a readable training state" in said


class Smuggled:
    """Anything but tensors and plain containers must not be unpickled from a run folder."""


def test_a_training_state_is_never_unpickled_freely(run, tmp_path, capsys):
    state = ckpt.load_state(run / ckpt.STATE)
    torch.save({**state, "extra": Smuggled()}, run / ckpt.STATE)
    said = one_line_error(capsys, *resume_args(run, tmp_path))
    assert "state.pt" in said


def test_files_are_written_with_the_users_umask(translation_run):  # noqa: F811
    umask = os.umask(0)
    os.umask(umask)
    for name in (ckpt.WEIGHTS, ckpt.LAST_WEIGHTS, ckpt.STATE, ckpt.CONFIG, "tokenizer.json"):
        mode = stat.S_IMODE((translation_run / name).stat().st_mode)
        assert mode == 0o666 & ~umask, (name, oct(mode))


def test_a_full_disk_stops_clearly_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "run"
    train_tiny_translation(out, max_steps=3, eval_every=3)
    before = (out / ckpt.STATE).read_bytes()
    real = ckpt.torch.save

    def full(obj, path, *args, **kwargs):
        real(obj, path, *args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt.torch, "save", full)
    with pytest.raises(InputError, match="No space left on device.*previous version is intact"):
        train_tiny_translation(out, max_steps=6, eval_every=3, resume=True)
    assert (out / ckpt.STATE).read_bytes() == before
    assert not list(out.glob(".*.tmp"))
    monkeypatch.undo()
    assert ckpt.load_state(out / ckpt.STATE)["step"] == 3


def test_non_finite_steps_are_skipped_counted_and_stop_training(tmp_path, monkeypatch):
    real = Trainer._train_step
    calls = []

    def poisoned(self, batches):  # steps 4 and 5 see an inf loss, then from step 8 on
        calls.append(1)
        if len(calls) in (4, 5) or len(calls) >= 8:
            for p in self.model.parameters():
                p.grad = None
            self.batch_index += self.config.accumulate
            return self._skip_step(float("inf"))
        return real(self, batches)

    monkeypatch.setattr(Trainer, "_train_step", poisoned)
    out = tmp_path / "run"
    with pytest.raises(InputError, match="5 steps in a row.*last checkpoint \\(step 3\\)"):
        train_tiny_translation(out, max_steps=20, eval_every=3, max_nonfinite=5)
    rows = [r for r in ckpt_rows(out) if r["train_loss"]]
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5]  # the skipped ones take no step
    assert rows[-1]["skipped_steps"] == "2"
    assert ckpt.load_state(out / ckpt.STATE)["step"] == 3  # the last good checkpoint


def ckpt_rows(run: Path) -> list[dict[str, str]]:
    import csv

    with open(run / ckpt.METRICS, newline="") as f:
        return list(csv.DictReader(f))


def test_a_real_nan_loss_is_skipped(tmp_path, monkeypatch):
    """The check sits on the real gradient: a NaN from the loss itself is caught."""
    from qkv.jobs.translation.task import TranslationTask

    real = TranslationTask.loss
    calls = []

    def nan_once(self, model, batch):
        loss, tokens = real(self, model, batch)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 2 else loss), tokens

    monkeypatch.setattr(TranslationTask, "loss", nan_once)
    summary = train_tiny_translation(tmp_path / "run", max_steps=4, eval_every=2)
    assert summary["skipped_steps"] == 1 and summary["steps"] == 4
    weights = ckpt.load_state(tmp_path / "run" / ckpt.STATE)["model"]
    assert all(t.isfinite().all() for t in weights.values() if t.is_floating_point())


def test_an_unwritable_out_is_reported_before_training(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder cannot be made inside a file (root included)
    out = blocker / "run"
    args = train_translation_args(write_splits(tmp_path), out, *TRANSLATION_OPTIONS)
    said = one_line_error(capsys, *args)
    assert "cannot write the run folder" in said
