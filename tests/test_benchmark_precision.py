"""benchmarks/precision.py: each job's probe figure and its training steps, on real batches
(no timings asserted: the decision follows the probe, and every job's data options resolve)."""

from pathlib import Path

import pytest
from benchmarks.harness import DATA
from benchmarks.precision import JOBS, job_data, job_section

from qkv.precision import MIN_LAYER_SPEEDUP


def test_a_jobs_section_times_both_precisions_and_decides_by_the_probe():
    section = job_section("vit", DATA, rounds=1, steps=1)  # the digits: no data folder needed
    assert set(section["ms_per_step"]) == {"fp32", "bf16"}
    assert section["probe_bf16_speedup"] > 0
    expected = "bf16" if section["probe_bf16_speedup"] >= MIN_LAYER_SPEEDUP else "fp32"
    assert section["auto_chooses"] == expected
    faster = "bf16" if section["step_bf16_speedup"]["median"] > 1 else "fp32"
    assert section["faster_step"] == faster
    assert [64, 192] in section["linear_shapes"]  # the ViT's attention projections (D = 64)


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is absent (the data sets)")
def test_every_text_jobs_data_options_name_existing_files():
    for name in JOBS:
        for key in ("train", "valid"):
            path = job_data(name, DATA).get(key)
            if path is None:
                continue
            found = list(Path(path).parent.glob(Path(path).name + "*"))
            assert found, f"{name} --{key} {path}"
