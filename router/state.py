"""State the router's parts share: the endpoint pool, the prefix indexes,
the session table. One instance per router process."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from router.config import RouterConfig
from router.pool.endpoints import Endpoint, Pool
from router.prefix.index import PrefixIndex

MAX_SESSIONS = 200_000


@dataclass
class RouterState:
    config: RouterConfig
    pool: Pool = field(default_factory=Pool)
    approx: PrefixIndex = field(default_factory=PrefixIndex)
    precise: PrefixIndex = field(default_factory=PrefixIndex)
    sessions: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def saturated(self, ep: Endpoint, now: float | None = None) -> bool:
        s = self.config.saturation
        if ep.stale(self.config.scrape.stale_after_s, now):
            return True
        return ep.load.waiting >= s.queue_threshold or ep.load.kv_usage >= s.kv_usage_threshold

    def remember_session(self, session: str, url: str) -> None:
        self.sessions[session] = url
        self.sessions.move_to_end(session)
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)

    def forget_endpoint(self, url: str) -> None:
        self.approx.clear(url)
        self.precise.clear(url)
