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


def pytest_terminal_summary(terminalreporter):
    """Say how many browser tests ran, so a run without a browser is never mistaken for one."""
    outcomes = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome in outcomes:
        for report in terminalreporter.stats.get(outcome, []):
            if "browser" in getattr(report, "keywords", {}) and report.when in ("call", "setup"):
                if outcome != "passed" or report.when == "call":
                    outcomes[outcome] += 1
    if any(outcomes.values()):
        terminalreporter.write_line(
            "browser tests: " + ", ".join(f"{n} {outcome}" for outcome, n in outcomes.items() if n)
        )
