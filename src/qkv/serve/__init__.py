"""``qkv serve``: trained runs of any job behind one HTTP service, with a live page.

``load_models`` loads the run folders once; ``create_app`` builds the FastAPI app over them;
``serve`` runs it with uvicorn until SIGTERM or Ctrl-C, finishing the requests in flight.
Needs the ``serve`` extra (``pip install 'qkv[serve]'``); the names are imported on first use,
so that ``qkv --help`` neither needs nor loads FastAPI.
"""

from __future__ import annotations

import importlib
from typing import Any

WHERE = {
    "create_app": "qkv.serve.app",
    "HostedModel": "qkv.serve.models",
    "load_models": "qkv.serve.models",
    "listen": "qkv.serve.server",
    "serve": "qkv.serve.server",
    "ServeSettings": "qkv.serve.settings",
}


def __getattr__(name: str) -> Any:
    if name not in WHERE:
        raise AttributeError(f"module 'qkv.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(WHERE[name]), name)


__all__ = list(WHERE)
