"""A fixed list of endpoints from the config file."""

from __future__ import annotations

from toposerve.router.config import StaticEndpoint
from toposerve.router.pool.endpoints import Endpoint, Pool


def load_static(pool: Pool, entries: list[StaticEndpoint]) -> list[Endpoint]:
    return [pool.upsert(Endpoint(url=e.url, role=e.role, revision=e.revision,
                                 path=e.path,
                                 bootstrap_port=e.bootstrap_port,
                                 kv_events=e.kv_events, kv_events_replay=e.kv_events_replay))
            for e in entries]
