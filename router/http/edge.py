"""Where a client's request enters the router: every answer in OpenAI's
error shape (the ``errors`` middleware, for every route, unknown ones
included), and for the API's routes the request's exchange, made here with
who asks, counted against the in-flight budget while it runs, and settled
with flow control however it ends (``Edge.take``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from toposerve.router.admission.budget import Budget, Overloaded
from toposerve.router.admission.tenants import Tenants
from toposerve.router.exchange import Exchange
from toposerve.router.http.director import Director
from toposerve.router.metrics import RouterMetrics
from toposerve.wire.errors import ApiError, error_response

log = structlog.get_logger("router")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ExchangeHandler = Callable[[Exchange], Awaitable[web.StreamResponse]]


class Edge:
    def __init__(self, budget: Budget, tenants: Tenants, director: Director) -> None:
        self.budget, self.tenants, self.director = budget, tenants, director

    def take(self, handler: ExchangeHandler) -> Handler:
        """``handler`` as an aiohttp handler: the request, counted in flight,
        its tenant named (401 for a bad key), becomes an exchange; when it
        ends, its charges are settled and its budget given back."""
        async def exchange(request: web.Request) -> web.StreamResponse:
            self.budget.enter()
            ex = Exchange(request, time.monotonic())
            refused = True  # until an answer is returned
            try:
                who = self.tenants.identify(request.headers.get("Authorization"))
                if isinstance(who, web.Response):
                    return who
                ex.tenant, ex.key_checked = who, self.tenants.keys is not None
                resp = await handler(ex)
                refused = resp.status >= 400
                return resp
            finally:
                self.director.settle(ex, refused)
                self.budget.leave(ex.hold)

        return exchange


def errors(metrics: RouterMetrics, max_header_bytes: int) -> Middleware:
    """Every refusal and fault as OpenAI's JSON error; every answer counted."""
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.monotonic()
        path = request.match_info.route.resource.canonical if (
            request.match_info.route.resource is not None) else "unmatched"
        try:
            resp = _oversized(request, max_header_bytes) or await handler(request)
        except Overloaded as err:
            resp = error_response(err.status, err.message, err.param, err.headers)
        except ApiError as err:
            resp = error_response(err.status, err.message, err.param)
        except web.HTTPException as err:
            resp = error_response(err.status, err.reason)
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # the client went away: nobody to answer
        except Exception as err:
            # a bug, not a refusal: the client still gets OpenAI's error
            # shape, and the log gets the traceback, once
            log.exception("request failed", path=path, error=repr(err))
            resp = error_response(500, f"internal error in the router ({type(err).__name__})")
        metrics.answered(path, resp.status, time.monotonic() - started)
        return resp

    return middleware


def _oversized(request: web.Request, limit: int) -> web.Response | None:
    """The JSON error for a request line or header line over ``limit``
    bytes; it names the header, never its value (a bearer token)."""
    line = len(request.method) + len(request.raw_path) + 10
    if line > limit:
        return error_response(414, f"request line over {limit} bytes (server.maxHeaderBytes)")
    for name, value in request.raw_headers:
        if len(name) + len(value) + 2 > limit:
            shown = name.decode("latin-1")[:64]
            return error_response(431, f"header {shown} over {limit} bytes "
                                       "(server.maxHeaderBytes)")
    return None
