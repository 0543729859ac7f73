"""One service for the serve tests: tiny runs of all four jobs, trained once per session,
hosted by uvicorn in a background thread on a free port."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="qkv serve needs the serve extra: pip install 'qkv[serve]'")
import httpx  # noqa: E402

from ..helpers import train_translation_args, write_splits  # noqa: E402
from ..viz.conftest import TRANSLATION_OPTIONS, qkv, train_encoder_run  # noqa: E402

# Small limits, so that the tests can pass them with small requests.
LIMITS = dict(max_body_bytes=200_000, max_inputs=64, max_chars=3000, max_beam=8)
# Long enough that concurrent test requests share batches even on a busy machine.
BATCH_WAIT_MS = 50.0


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Job name -> (run folder, an input it reads), each a tiny run trained for a few steps."""
    folder = tmp_path_factory.mktemp("serve-translation")
    translation = folder / "run"
    args = train_translation_args(write_splits(folder), translation, *TRANSLATION_OPTIONS)
    assert qkv(*args) == 0
    found = {"translation": (translation, "the dog sees a cat")}
    for job in ("tagger", "classifier", "vit"):
        found[job] = train_encoder_run(job, tmp_path_factory.mktemp(f"serve-{job}"))
    return found


class Running:
    """A service running in this process: its base URL, app and uvicorn server."""

    def __init__(self, models, settings) -> None:
        import uvicorn

        from qkv.serve import create_app, listen

        self.models = models
        self.app = create_app(models, settings)
        self.socket = listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "no service started"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="session")
def service(runs):
    """The running service hosting ``translation``, ``tagger``, ``classifier`` and ``vit``."""
    from qkv.serve import ServeSettings, load_models

    settings = ServeSettings(port=0, batch_wait_ms=BATCH_WAIT_MS, **LIMITS)
    specs = [f"{job}={folder}" for job, (folder, _) in runs.items()]
    models = load_models(specs, "cpu", settings.batch_tokens, settings.batch_wait_ms / 1000)
    running = Running(models, settings)
    yield running
    running.stop()


@pytest.fixture
def client(service):
    with httpx.Client(base_url=service.url, timeout=60) as c:
        yield c
