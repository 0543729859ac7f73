"""The settings of ``qkv serve``: where it listens, how it batches, what a request may hold."""

from __future__ import annotations

from dataclasses import dataclass

from qkv.config import option
from qkv.errors import InputError


@dataclass
class ServeSettings:
    """How the service listens, gathers requests and bounds them; the options of ``qkv serve``."""

    host: str = option("127.0.0.1", "address to listen on (0.0.0.0: every interface)")
    port: int = option(8000, "port to listen on; 0 picks a free one")
    # A few milliseconds cost a lone request little and let concurrent ones share a batch.
    batch_wait_ms: float = option(5.0, "milliseconds to gather concurrent requests into a batch")
    batch_tokens: int = option(4096, "input tokens per gathered batch, padding included")
    max_body_bytes: int = option(4 << 20, "largest request body (an uploaded image included)")
    max_inputs: int = option(256, "most sentences or texts in one request")
    max_chars: int = option(2000, "longest sentence or text, in characters")
    max_beam: int = option(16, "largest beam a translation request may ask for")
    # In-flight requests get this long to finish after SIGTERM before they are cut off.
    shutdown_timeout: float = option(30.0, "seconds to finish in-flight requests on SIGTERM")

    def __post_init__(self) -> None:
        bad = [
            f"--{name.replace('_', '-')} {getattr(self, name)}"
            for name in ("batch_tokens", "max_body_bytes", "max_inputs", "max_chars", "max_beam")
            if getattr(self, name) < 1
        ]
        bad += [
            f"--{name.replace('_', '-')} {getattr(self, name)}"
            for name in ("batch_wait_ms", "shutdown_timeout")
            if getattr(self, name) < 0
        ]
        if not 0 <= self.port <= 65535:
            bad.append(f"--port {self.port}")
        if bad:
            raise InputError(
                f"{', '.join(bad)}: out of range; use a positive number (port 0-65535)"
            )
