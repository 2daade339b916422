"""A fixed list of endpoints from the config file."""

from __future__ import annotations

from router.config import StaticEndpoint
from router.endpoints import Endpoint, Pool
from topology.model import DomainPath


def load_static(pool: Pool, entries: list[StaticEndpoint]) -> list[Endpoint]:
    return [pool.upsert(Endpoint(url=e.url, role=e.role, revision=e.revision,
                                 path=DomainPath(host=e.node) if e.node else None,
                                 bootstrap_port=e.bootstrap_port,
                                 kv_events=e.kv_events, kv_events_replay=e.kv_events_replay))
            for e in entries]
