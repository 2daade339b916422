"""Which revision of the model servers a request goes to. Each endpoint
serves one revision (read from its pod's labels, see ``revision_of``);
during a rollout two or more are live at once. A request is routed inside
one revision: the split between revisions follows configured weights or,
without them, each revision's ready capacity; a session keeps its revision
while that revision has ready capacity; and a split request's decode half
is picked in its prefill half's revision, since KV does not move between
revisions (their engines may differ in model, block size or connector).

The choice is weighted rendezvous hashing on the session id: two replicas
with the same view of the pool pick the same revision for a session
without talking, and a weight that shifts during a rollout moves only the
sessions it must, one way (from the shrinking revision to the growing one)."""

from __future__ import annotations

import hashlib
import math
import random
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from toposerve.router.pool.endpoints import Endpoint
from toposerve.topology.workloads import DS_REVISION, LWS_REVISION

TOPOSERVE_REVISION = "toposerve.io/revision"
CONTROLLER_REVISION = "controller-revision-hash"  # StatefulSet and DaemonSet pods
# in order: the first a pod carries is its revision (docs/design.md §5)
REVISION_LABELS = (DS_REVISION, LWS_REVISION, TOPOSERVE_REVISION, CONTROLLER_REVISION)
MAX_SESSIONS = 200_000
# roles that can answer a request: a revision of prefill endpoints only serves nothing
SERVING_ROLES = (None, "decode", "prefill-decode")


def revision_of(labels: Mapping[str, str], first: str | None = None) -> str | None:
    """The pod's revision: ``first`` (a configured label) if it carries it,
    then the standard labels in order; None if it carries none."""
    for key in (first, *REVISION_LABELS) if first else REVISION_LABELS:
        value = labels.get(key)
        if value:
            return value
    return None


def key_of(ep: Endpoint) -> str:
    """The endpoint's revision as a key: "" for one that names none."""
    return ep.revision or ""


def ready_capacity(eps: list[Endpoint]) -> dict[str, int]:
    """Endpoints per revision that can take a request now (healthy, not
    draining, of a role that answers)."""
    out: dict[str, int] = {}
    for e in eps:
        if e.healthy and not e.draining and e.role in SERVING_ROLES:
            out[key_of(e)] = out.get(key_of(e), 0) + 1
    return out


def split_weights(capacity: Mapping[str, int], weights: Mapping[str, float]
                  ) -> dict[str, float]:
    """Each live revision's share: its configured weight when any live
    revision has one (an unnamed revision then gets none), else its ready
    capacity, so traffic follows the rollout pod by pod."""
    live = {r: c for r, c in capacity.items() if c > 0}
    named = {r: weights[r] for r in live if weights.get(r, 0) > 0}
    if named:
        return named
    return {r: float(c) for r, c in live.items()}


def _unit(key: str, revision: str) -> float:
    """A uniform number in (0, 1) from the pair, the same on every replica."""
    digest = hashlib.blake2b(f"{key}\0{revision}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2.0**64


def rendezvous(key: str, weights: Mapping[str, float]) -> str:
    """Weighted rendezvous (highest random weight) pick of a revision for
    ``key``: revision r wins with probability weights[r] / sum(weights)."""
    return max(weights, key=lambda r: -weights[r] / math.log(_unit(key, r)))


@dataclass
class Revisions:
    """The revision each request and session is routed in."""

    weights: Mapping[str, float] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    _sessions: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def choose(self, session: str | None, capacity: Mapping[str, int]) -> str | None:
        """A revision with ready capacity: the session's own while it has
        some, else a weighted pick (remembered for the session); None when
        no revision has any."""
        kept = self._sessions.get(session) if session is not None else None
        if session is not None and kept is not None and capacity.get(kept, 0) > 0:
            self._sessions.move_to_end(session)
            return kept
        shares = split_weights(capacity, self.weights)
        if not shares:
            return None
        picked = rendezvous(session if session is not None else f"{self.rng.getrandbits(64):x}",
                            shares)
        if session is not None:
            self._sessions[session] = picked
            self._sessions.move_to_end(session)
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return picked
