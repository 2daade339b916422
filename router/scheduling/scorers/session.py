"""Session affinity: a session's requests go where it went before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.cycle import CycleState
from toposerve.router.scheduling.plugins import FromState


@dataclass
class SessionScorer(FromState):
    """Sticks a session (``x-session-id``, or the endpoint that served a
    previous response) to its endpoint until that endpoint saturates."""

    name: ClassVar[str] = "session"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        url = ctx.affinity_url or (self.state.sessions.get(ctx.session) if ctx.session else None)
        # the session's endpoint alone (the others are left out: 0)
        if (url is not None and (e := cycle.by_url(eps).get(url)) is not None
                and not self.state.saturated(e)):
            return {e: 1.0}
        return {}

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        if ctx.session:
            self.state.remember_session(ctx.session, ep.url)
