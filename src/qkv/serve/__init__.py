"""``qkv serve``: trained runs of any job behind one HTTP service, with a live page.

``load_models`` loads the run folders once; ``create_app`` builds the FastAPI app over them;
``serve`` runs it with uvicorn until SIGTERM or Ctrl-C, finishing the requests in flight.
Needs the ``serve`` extra (``pip install 'qkv[serve]'``).
"""

from __future__ import annotations

from qkv.serve.app import create_app
from qkv.serve.models import HostedModel, load_models
from qkv.serve.server import listen, serve
from qkv.serve.settings import ServeSettings

__all__ = ["HostedModel", "ServeSettings", "create_app", "listen", "load_models", "serve"]
