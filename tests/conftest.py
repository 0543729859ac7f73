import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """Measurements (e.g. the bf16 speed probe) are cached per test session, not in ~/.cache."""
    monkeypatch.setenv("QKV_CACHE", str(tmp_path_factory.getbasetemp() / "qkv-cache"))
