"""Prefill/decode disaggregation (docs/design.md §6). vLLM's NixlConnector: the
prompt goes to a prefill endpoint as a one-token, non-streamed request that
leaves its KV there (``do_remote_decode``); the prefill's answer carries the
``kv_transfer_params`` a decode endpoint needs to pull that KV; the original
request goes to the decode endpoint with them and its answer streams back.
SGLang: both get the request at once, with the prefill server's bootstrap
host and port and a random room; the answer comes from decode. Both
requests carry the same X-Request-Id."""

from __future__ import annotations

import random
from typing import Any
from urllib.parse import urlsplit

import orjson

from toposerve.router.config import RouterConfig
from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.pool.revisions import Revisions
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.cycle import CycleState
from toposerve.router.scheduling.filters import RevisionFilter, RoleFilter
from toposerve.router.scheduling.profile import Decision, Scheduler
from toposerve.router.scheduling.scorers.prefix import APPROX_BLOCK_BYTES, approx_match
from toposerve.router.state import RouterState
from toposerve.wire.kv_transfer import (
    PREFILL_REQUEST,
    REMOTE_PREFILL_FIELDS,
    is_hand_over_field,
)

RESPONSES_PATH = "/v1/responses"
# the token-limit fields of each generation API; a prefill sets them to one
_LIMITS = {RESPONSES_PATH: ("max_output_tokens",)}
_DEFAULT_LIMITS = ("max_tokens", "max_completion_tokens")


def drop_hand_over(doc: dict[str, Any]) -> bool:
    """Removes a client's hand-over fields from its body ``doc``: which host
    and KV blocks a model server pulls from is the router's to say (it sets
    them when it splits a request), never a client's. Whether any was there
    (only then does the body need writing again)."""
    found = [k for k in doc if is_hand_over_field(k)]
    for k in found:
        del doc[k]
    return bool(found)


def prefill_body(doc: dict[str, Any], path: str) -> bytes:
    """The request as sent to the prefill endpoint: one token, no stream."""
    out = {k: v for k, v in doc.items() if k != "stream_options"}
    first, *rest = _LIMITS.get(path, _DEFAULT_LIMITS)
    out.update(stream=False, kv_transfer_params=dict(PREFILL_REQUEST))
    out[first] = 1
    out.update((k, 1) for k in rest if k in out)
    return orjson.dumps(out)


def decode_body(doc: dict[str, Any], kv_params: dict[str, Any]) -> bytes:
    return orjson.dumps({**doc, "kv_transfer_params": kv_params})


def kv_params_of(answer: bytes) -> dict[str, Any] | None:
    """The prefill answer's ``kv_transfer_params``, if complete."""
    try:
        doc = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    params = doc.get("kv_transfer_params") if isinstance(doc, dict) else None
    if not isinstance(params, dict) or any(params.get(k) is None for k in REMOTE_PREFILL_FIELDS):
        return None
    return params


class Disaggregation:
    """Picks the two endpoints of a split request: the prefill endpoint by
    the main profile (prefix affinity is what makes prefill cheap), the
    decode endpoint by ``disaggregation.decode`` once the prefill endpoint
    is known (so it can sit next to it)."""

    def __init__(self, state: RouterState, cfg: RouterConfig, kv: KVIndex | None,
                 revisions: Revisions | None = None) -> None:
        """``revisions``: the router's (shared with its whole-request
        profile, so a session keeps one revision however it is served)."""
        self.state = state
        # both halves in one revision: KV does not move between revisions
        same = RevisionFilter(revisions or Revisions(cfg.revisions.weights))
        self.protocol = cfg.disaggregation.protocol
        self.min_prefill_tokens = cfg.disaggregation.min_prefill_tokens
        self.bootstrap_port = cfg.disaggregation.bootstrap_port
        self._rng = random.Random()
        self.prefill = Scheduler(state, cfg.profile, kv, "profile",
                                 [same, RoleFilter(state, "prefill", exact=True)])
        self.decode = Scheduler(state, cfg.disaggregation.decode, None, "disaggregation.decode",
                                [same, RoleFilter(state, "decode", exact=True)])

    def applies(self, ctx: RequestContext) -> bool:
        """Both stages have somewhere to go."""
        return bool(self.prefill.candidates(ctx)) and bool(self.decode.candidates(ctx))

    def worth_splitting(self, ctx: RequestContext) -> bool:
        """Enough of the prompt is cached on no prefill endpoint: below
        ``minPrefillTokens`` the extra hop and the KV move cost more than a
        decode endpoint's own prefill."""
        if not self.min_prefill_tokens:
            return True
        # a cycle of its own: the prefill stage scores its candidates after
        # admission, when the pool may have changed
        frac = approx_match(self.state, ctx, CycleState(), self.prefill.candidates(ctx),
                            APPROX_BLOCK_BYTES)
        uncached = ctx.token_estimate * (1 - max(frac.values(), default=0.0))
        return uncached >= self.min_prefill_tokens

    def pick_decode(self, ctx: RequestContext, prefill: Endpoint | None) -> Decision:
        ctx.prefill = prefill
        return self.decode.schedule(ctx)

    def bootstrap(self, prefill: Endpoint) -> dict[str, Any]:
        """SGLang's fields: where the decode server finds the KV, and a
        random room that pairs the two requests."""
        return {"bootstrap_host": urlsplit(prefill.url).hostname,
                "bootstrap_port": prefill.bootstrap_port or self.bootstrap_port,
                "bootstrap_room": self._rng.getrandbits(63)}
