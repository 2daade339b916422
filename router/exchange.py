"""One client request as the router holds it, from the edge to its end: an
exchange. The HTTP edge (``toposerve.router.http.edge``) creates it with
who asks; the handler fills in what was asked; the director's stages
(``toposerve.router.http.director``: admit, schedule, relay, settle) read
it and record on it what they decided and what came back. Nothing about a
request travels any other way (no aiohttp request keys), so a reader finds
all of a request's state here. The director's admit, schedule and settle
stages read only what ``Asked`` names of it, so the endpoint picker
(``toposerve.router.epp``), whose requests come over gRPC from a proxy, runs
the same stages over its own record of a request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from toposerve.router.admission.budget import Hold
from toposerve.router.admission.flow_control import Classified
from toposerve.router.admission.usage import Answered
from toposerve.router.pool.endpoints import Endpoint, Work
from toposerve.router.request import RequestContext


class Asked(Protocol):
    """What the director's admit, schedule and settle stages read and
    record of a request, whichever edge took it."""

    tenant: str
    ctx: RequestContext | None
    max_tokens: int | None
    charges: list[Classified]
    answered: Answered | None
    output_tokens: int | None

    @property
    def client_headers(self) -> Mapping[str, str]:
        """The headers the client sent (flow control reads its objective,
        fairness id and SLO there)."""
        ...

    @property
    def body_size(self) -> int:
        """The bytes of its body, as the client declared them."""
        ...


@dataclass(slots=True)
class Route:
    """Where a request's answer comes from: the endpoints to try (best
    first), what to send them, what it weighs on them, and for a split
    request the prefill endpoint that holds its KV."""

    ranked: list[Endpoint]
    body: bytes
    work: Work
    prefill: Endpoint | None = None
    headers: dict[str, str] = field(default_factory=dict)  # for the client


@dataclass(slots=True, eq=False)
class Exchange:
    request: web.Request
    started: float  # time.monotonic() when the edge took it
    # who asks: the API key's tenant ("" without keys); whether the router
    # checked that key (then it is the router's credential, not sent on)
    tenant: str = ""
    key_checked: bool = False
    hold: Hold = field(default_factory=Hold)  # the body bytes it holds of the budget
    # what was asked (a generation request; the handler sets these)
    path: str = ""  # the upstream path
    body: bytes = b""  # what goes upstream unless a stage rewrites it
    doc: dict[str, Any] = field(default_factory=dict)  # the same, parsed
    ctx: RequestContext | None = None  # what the scheduler knows of it
    headers: dict[str, str] = field(default_factory=dict)  # upstream's, X-Request-Id included
    max_tokens: int | None = None  # the output it may ask for: flow control's cost
    # what the stages decided
    charges: list[Classified] = field(default_factory=list)  # one an admission
    route: Route | None = None
    # what came back
    endpoint: Endpoint | None = None  # the one that answered
    answered: Answered | None = None  # what the proxy relayed of the answer
    output_tokens: int | None = None  # the answer's own usage, when a handler read it

    @property
    def request_id(self) -> str:
        return self.headers["X-Request-Id"]

    @property
    def client_headers(self) -> Mapping[str, str]:
        return self.request.headers

    @property
    def body_size(self) -> int:
        return self.request.content_length or 0
