"""OpenAI-style JSON errors, as vLLM and the OpenAI API send them:
``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
         408: "RequestTimeout", 413: "RequestTooLarge", 414: "URITooLong",
         415: "UnsupportedMediaType", 431: "RequestHeaderFieldsTooLarge",
         422: "UnprocessableEntity", 429: "RateLimitError", 500: "InternalServerError",
         502: "BadGateway", 503: "ServiceUnavailable", 504: "GatewayTimeout"}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": TYPES.get(status, "Error"), "param": param,
                      "code": status}}


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(error_body(status, message, param)),
                        content_type="application/json", headers=headers)


def sse_error(status: int, message: str) -> bytes:
    """An error as one SSE event, for failures after a stream has begun."""
    return b"data: " + orjson.dumps(error_body(status, message)) + b"\n\n"


class ApiError(Exception):
    """Raised by handlers; the middleware turns it into an OpenAI-style error."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def from_validation(err: ValidationError) -> ApiError:
    """A 400 naming the first invalid field."""
    first = err.errors()[0]
    loc = ".".join(str(x) for x in first["loc"]) or None
    return ApiError(400, f"{loc}: {first['msg']}" if loc else first["msg"], loc)
