"""Bad requests become one JSON message, ``{"error": "..."}``, with a 4xx status; never a traceback.

``install`` adds the handlers to an app; ``BodyLimit`` refuses a body over the size limit
before any endpoint reads it.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qkv.errors import InputError

log = logging.getLogger("qkv.serve")


class BadRequest(HTTPException):
    """A request the service cannot answer, and why; 422 unless another status fits better."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(status_code=status, detail=message)


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def validation_message(errors: list[dict[str, Any]]) -> str:
    """Pydantic's errors as one sentence: where in the request, and what was wrong."""
    parts = []
    for error in errors[:3]:
        if error.get("type") == "json_invalid":
            reason = error.get("ctx", {}).get("error", "")
            parts.append(f"the body is not valid JSON ({reason})" if reason else "invalid JSON")
            continue
        where = ".".join(str(x) for x in error.get("loc", ()) if x != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more


def failed(request: Request) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return error_response(500, "the service failed on this request; see its log")


class Route(APIRoute):
    """A route whose unexpected errors become a 500 answer on a connection that stays open.

    (An error left to Starlette's outermost handler is answered too, but its connection is
    then closed under a client that may be reusing it.)
    """

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except (HTTPException, RequestValidationError, InputError):
                raise
            except Exception:
                return failed(request)

        return answer


def install(app: FastAPI) -> None:
    """Answer every error as ``{"error": message}``; routes added later catch their own."""
    app.router.route_class = Route

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(422, validation_message(list(error.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail))

    @app.exception_handler(InputError)
    async def input_error(request: Request, error: InputError) -> JSONResponse:
        return error_response(422, str(error))

    @app.exception_handler(Exception)
    async def internal(request: Request, error: Exception) -> JSONResponse:
        return failed(request)


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets 413 and reaches no endpoint.

    The body is read (up to the limit) before the app runs, so chunked uploads are bounded
    as well as those that announce their length.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        declared = headers.get(b"content-length", b"0").decode("latin-1")
        if not declared.isdigit() or int(declared) > self.limit:
            await self.refuse(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self.refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"the request body is over the limit of {self.limit} bytes (--max-body-bytes)"
        await error_response(413, message)(scope, receive, send)
