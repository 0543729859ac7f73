"""--precision auto: bf16 only where it measures clearly faster on this device: the model's
own linear layers in bf16 autocast, or without a model one square matmul."""

import json

import pytest
import torch
from torch import nn

from qkv import precision
from qkv.precision import (
    MIN_LAYER_SPEEDUP,
    MIN_SPEEDUP,
    cache_path,
    choose_precision,
    linear_shapes,
    machine_key,
)

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


def test_the_linear_shapes_are_the_models_distinct_layers():
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8), nn.Linear(8, 32))
    assert linear_shapes(model) == ((8, 32), (32, 8))


def test_a_model_is_timed_by_its_own_layers_and_cached_per_shapes(bf16_capable):
    seen = []

    def measure(device):
        seen.append(device)
        return 1.3  # enough for a model's layers (casts timed), not for a bare matmul

    narrow, wide = nn.Linear(16, 64), nn.Linear(64, 256)
    assert MIN_LAYER_SPEEDUP <= 1.3 < MIN_SPEEDUP
    choice = choose_precision("auto", CPU, measure, model=narrow)
    assert choice.precision == "bf16" and "linear layers" in choice.reason
    assert choose_precision("auto", CPU, measure, model=narrow) == choice  # cached
    choose_precision("auto", CPU, measure, model=wide)  # other shapes: measured again
    assert len(seen) == 2
    cached = json.loads(cache_path().read_text())
    assert {key.rsplit("|", 1)[-1] for key in cached} >= {"linear 16x64", "linear 64x256"}
    assert choose_precision("auto", CPU, measure=lambda d: 1.3).precision == "fp32"


def test_the_layer_probe_measures_a_ratio_and_leaves_the_random_state_alone():
    torch.manual_seed(3)
    before = torch.get_rng_state()
    ratio = precision.measure_layer_speedup(CPU, [(16, 32), (32, 16)], rows=64, repeats=1)
    assert ratio > 0
    assert torch.equal(torch.get_rng_state(), before)


def test_the_choice_and_its_reason_are_in_the_summary(tmp_path, monkeypatch):
    from .helpers import train_tiny_translation

    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "bf16_supported", lambda device: True)
    timed = []

    def measure(device, shapes):
        timed.append(shapes)
        return 0.3

    monkeypatch.setattr(precision, "measure_layer_speedup", measure)
    summary = train_tiny_translation(tmp_path / "run", max_steps=1, precision="auto")
    assert summary["precision"] == "fp32" and "0.30x" in summary["precision_reason"]
    assert "linear layers" in summary["precision_reason"]
    assert len(timed) == 1 and len(timed[0]) >= 2  # the translator's own layer shapes
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["precision_reason"] == summary["precision_reason"]


def test_only_rank_0_measures_and_every_rank_takes_its_choice(bf16_capable, tmp_path, monkeypatch):
    from qkv.training import shared_precision

    monkeypatch.setenv("QKV_CACHE", str(tmp_path))
    timed = []

    def measure(device, shapes):
        timed.append(shapes)
        return 3.0

    monkeypatch.setattr(precision, "measure_layer_speedup", measure)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
    other = shared_precision("auto", CPU, model, rank=1, world=1)
    assert timed == [] and other.reason == "rank 0's choice"
    assert not cache_path().exists()  # nothing measured, nothing cached
    first = shared_precision("auto", CPU, model, rank=0, world=1)
    assert len(timed) == 1 and first.precision == "bf16" and "3.00x" in first.reason
    assert shared_precision("bf16", CPU, model, rank=1, world=1).reason == "--precision bf16"


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: {family}
model\t\t: {model}
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu avx2 avx512f avx512_bf16

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 99
model name\t: another
"""


def test_two_processors_of_one_name_are_told_apart_by_their_generation():
    zen4 = precision.read_cpuinfo(CPUINFO.format(family=25, model=17))
    zen5 = precision.read_cpuinfo(CPUINFO.format(family=26, model=2))
    assert zen4["model name"] == zen5["model name"] == "AMD EPYC"  # the first block only
    assert "avx512_bf16" in zen4["flags"].split()
    assert precision.cpu_generation(zen4) == "AuthenticAMD family 25 model 17 stepping 1"
    assert precision.cpu_generation(zen5) == "AuthenticAMD family 26 model 2 stepping 1"
    assert precision.cpu_generation({"model name": "a CPU without families"}) == ""


def test_the_cached_measurement_is_kept_per_processor_generation(monkeypatch):
    zen4 = precision.read_cpuinfo(CPUINFO.format(family=25, model=17))
    zen5 = precision.read_cpuinfo(CPUINFO.format(family=26, model=2))
    keys = []
    for entries in (zen4, zen5):
        monkeypatch.setattr(precision, "read_cpuinfo", lambda text=None, e=entries: e)
        keys.append(machine_key(CPU))
    assert keys[0] != keys[1] and "family 26" in keys[1] and "avx512_bf16" in keys[1]
