"""Running the service: a listening socket opened up front, then uvicorn until a signal.

The socket is bound before uvicorn starts, so a port in use is one clear error and port 0
gets a free port whose number is printed. On SIGTERM or Ctrl-C uvicorn stops accepting
connections and lets the requests in flight finish (up to ``shutdown_timeout`` seconds);
then the batchers stop.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

from fastapi import FastAPI

from qkv.errors import InputError
from qkv.serve.settings import ServeSettings


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port``; a port that cannot be had is an InputError."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        raise InputError(
            f"--host {host} --port {port}: cannot listen there ({error.strerror or error}); "
            "pick another port, or 0 for a free one"
        ) from None
    sock.set_inheritable(True)
    return sock


def serve(app: FastAPI, settings: ServeSettings, out: TextIO = sys.stdout) -> None:
    """Run ``app`` until SIGTERM or Ctrl-C; prints the address it answers on."""
    import uvicorn

    sock = listen(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"qkv serve: http://{shown}:{port}/ (Ctrl-C or SIGTERM stops it)", file=out, flush=True)
    config = uvicorn.Config(
        app,
        log_level="info",
        timeout_graceful_shutdown=settings.shutdown_timeout,
    )
    quiet_exit_server(uvicorn.Server)(config).run(sockets=[sock])


def quiet_exit_server(base: type) -> type:
    """``uvicorn.Server`` whose SIGTERM or Ctrl-C stop ends the process normally (status 0).

    uvicorn raises the signal again once it has stopped, so the process would die of it.
    """

    class Server(base):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            stops = (signal.SIGINT, signal.SIGTERM)
            previous = {s: signal.signal(s, self.handle_exit) for s in stops}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    return Server
