"""--precision auto: bf16 only where a bf16 matmul measures clearly faster on this device."""

import json

import pytest
import torch

from qkv import precision
from qkv.precision import MIN_SPEEDUP, cache_path, choose_precision, machine_key

CPU = torch.device("cpu")


@pytest.fixture
def bf16_capable(monkeypatch):
    monkeypatch.setattr(precision, "bf16_supported", lambda device: True)


def test_auto_picks_fp32_where_bf16_is_slow(bf16_capable):
    choice = choose_precision("auto", CPU, measure=lambda device: 0.22)
    assert choice.precision == "fp32" and choice.autocast_dtype is None
    assert "0.22x" in choice.reason and choice.bf16_speedup == 0.22


def test_auto_picks_bf16_where_bf16_is_fast(bf16_capable, tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path))
    choice = choose_precision("auto", CPU, measure=lambda device: 4.4)
    assert choice.precision == "bf16" and choice.autocast_dtype is torch.bfloat16


def test_the_measurement_is_cached_per_machine(bf16_capable, tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path))
    calls = []

    def measure(device):
        calls.append(device)
        return 3.0

    first = choose_precision("auto", CPU, measure)
    second = choose_precision("auto", CPU, measure)
    assert len(calls) == 1 and first == second
    cached = json.loads(cache_path().read_text())
    assert cached == {machine_key(CPU): 3.0}


def test_asked_precisions_are_kept_and_unsupported_bf16_falls_back(monkeypatch):
    assert choose_precision("fp32", CPU, measure=lambda d: 9.0).precision == "fp32"
    assert choose_precision("bf16", CPU, measure=lambda d: 0.1).precision == "bf16"
    monkeypatch.setattr(precision, "bf16_supported", lambda device: False)
    choice = choose_precision("auto", CPU, measure=lambda d: 9.0)
    assert choice.precision == "fp32" and "no bf16 support" in choice.reason


def test_the_real_probe_measures_a_positive_ratio():
    ratio = precision.measure_bf16_speedup(CPU, n=128, repeats=2)
    assert ratio > 0 and MIN_SPEEDUP > 1


def test_the_choice_and_its_reason_are_in_the_summary(tmp_path, monkeypatch):
    from .helpers import train_tiny_translation

    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "bf16_supported", lambda device: True)
    monkeypatch.setattr(precision, "measure_bf16_speedup", lambda device: 0.3)
    summary = train_tiny_translation(tmp_path / "run", max_steps=1, precision="auto")
    assert summary["precision"] == "fp32" and "0.30x" in summary["precision_reason"]
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["precision_reason"] == summary["precision_reason"]
