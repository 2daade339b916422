"""State the router's parts share: the endpoint pool, the prefix indexes,
the session table. One instance per router process."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from toposerve.router.config import RouterConfig
from toposerve.router.pool.endpoints import Endpoint, Pool
from toposerve.router.pool.saturation import saturated
from toposerve.router.prefix.index import PrefixIndex

MAX_SESSIONS = 200_000


@dataclass
class RouterState:
    config: RouterConfig
    pool: Pool = field(default_factory=Pool)
    approx: PrefixIndex = field(default_factory=PrefixIndex)
    precise: PrefixIndex = field(default_factory=PrefixIndex)
    sessions: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def saturated(self, ep: Endpoint, now: float | None = None) -> bool:
        # one notion of "full" for the filters, sessions and flow control
        return saturated(ep, self.config, now)

    def remember_session(self, session: str, url: str) -> None:
        self.sessions[session] = url
        self.sessions.move_to_end(session)
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)

    def forget_endpoint(self, url: str) -> None:
        self.approx.clear(url)
        self.precise.clear(url)
