"""Tenants: an API key (``Authorization: Bearer``) names a tenant, which is
its fairness id, with a default objective and optional request and token
rates. Without configured keys nothing is checked and the tenant is ""
(the llm-d fairness header names the flow then).

The router's HTTP edge asks ``Tenants.identify`` before any handler runs
and keeps the answer on the request's exchange, so every part of the
router (the flow controller, the Responses store's isolation) reads one
answer to "who is asking".

Router processes that share a view (replicas, workers) share the rates
too: each tells the others what its tenants spent (``spent``, carried on
its load reports) and charges its own buckets what the others' spent
(``charge``), so a tenant's rate holds across them, not once per process."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
import structlog
from aiohttp import web

from toposerve.router.admission.keys import KeySource, KeyTable, digest
from toposerve.router.admission.ratelimit import Bucket, bucket
from toposerve.router.config import FlowControlConfig, TenantConfig

log = structlog.get_logger("router.admission.tenants")

# the metrics' tenant label of those beyond flowControl.tenants.metricTenants
OTHER_TENANTS = "other"
# probes and scrapes carry no key
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})


def unauthorized(message: str) -> web.Response:
    """401 as OpenAI sends it."""
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": "invalid_api_key"}}
    return web.Response(status=401, body=orjson.dumps(body), content_type="application/json",
                        headers={"WWW-Authenticate": 'Bearer realm="toposerve"'})


def bearer(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


class _Limits:
    def __init__(self, t: TenantConfig) -> None:
        self.requests: Bucket | None = bucket(t.requests_per_s)
        self.tokens: Bucket | None = bucket(t.tokens_per_s)


class Tenants:
    def __init__(self, cfg: FlowControlConfig) -> None:
        self.cfg = cfg.tenants
        self.settings = {t.name: t for t in self.cfg.tenants}
        self._limits = {t.name: _Limits(t) for t in self.cfg.tenants}
        # the tenants with a label value of their own: the configured first
        self._labelled = set(list(self.settings)[:self.cfg.metric_tenants])
        # requests and tokens taken since the peers were last told, per tenant
        self._spent: dict[str, list[float]] = {}
        self.keys: KeyTable | None = None  # None: no keys configured
        self.source = (KeySource(self.cfg.keys, self._replace) if self.cfg.keys is not None
                       else None)
        if self.source is not None:
            self.keys = {}
            self.source.load_now()

    def _replace(self, keys: KeyTable) -> None:
        unknown = sorted(set(keys.values()) - set(self.settings))
        if unknown and self.settings:
            log.info("tenants with keys but no settings get the defaults", tenants=unknown)
        self.keys = keys

    def who(self, authorization: str | None) -> str | None:
        """The tenant the request's key names; "" when no keys are configured;
        None for a missing or unknown key."""
        if self.keys is None:
            return ""
        key = bearer(authorization)
        if key is None:
            return None
        try:
            return self.keys.get(digest(key))
        except UnicodeEncodeError:  # bytes that are not UTF-8 (the header keeps them escaped)
            return None

    def metric_label(self, tenant: str) -> str:
        """The tenant's label value in /metrics: its name while there are
        fewer than ``metricTenants`` of them, else ``other``."""
        if tenant not in self._labelled:
            if len(self._labelled) >= self.cfg.metric_tenants:
                return OTHER_TENANTS
            self._labelled.add(tenant)
        return tenant

    def objective(self, tenant: str) -> str | None:
        t = self.settings.get(tenant)
        return t.objective if t is not None else None

    def cap(self, tenant: str, priority: int) -> int:
        """The priority a tenant may run at: its maxPriority at most."""
        t = self.settings.get(tenant)
        return priority if t is None or t.max_priority is None else min(priority,
                                                                        t.max_priority)

    def over_limit(self, tenant: str, tokens: int, now: float) -> str | None:
        """Why the tenant may not send this request now, or None."""
        lim = self._limits.get(tenant)
        if lim is None:
            return None
        if lim.requests is not None:
            if not lim.requests.take(1, now):
                return f"tenant {tenant} is over its request rate ({lim.requests.rate:g}/s)"
            self._note(tenant, 1, 0)
        if lim.tokens is not None:
            if not lim.tokens.take(tokens, now):
                return f"tenant {tenant} is over its token rate ({lim.tokens.rate:g}/s)"
            self._note(tenant, 0, tokens)
        return None

    def settle(self, tenant: str, tokens: int, now: float) -> None:
        """Charges the tenant's token bucket what a request cost beyond what
        ``over_limit`` took (negative: gives the excess back)."""
        lim = self._limits.get(tenant)
        if lim is not None and lim.tokens is not None and tokens:
            lim.tokens.settle(tokens, now)
            self._note(tenant, 0, tokens)

    def _note(self, tenant: str, requests: float, tokens: float) -> None:
        s = self._spent.setdefault(tenant, [0.0, 0.0])  # configured tenants only: bounded
        s[0] += requests
        s[1] += tokens

    def spent(self) -> dict[str, list[float]]:
        """What each tenant with a rate took here since the last call."""
        out, self._spent = self._spent, {}
        return out

    def charge(self, spent: Mapping[str, tuple[float, float]], now: float) -> None:
        """Charges the buckets what another process's tenants took there
        (requests, tokens); a tenant without a rate here is ignored."""
        for tenant, (requests, tokens) in spent.items():
            lim = self._limits.get(tenant)
            if lim is None:
                continue
            if lim.requests is not None and requests:
                lim.requests.settle(requests, now)
            if lim.tokens is not None and tokens:
                lim.tokens.settle(tokens, now)

    def identify(self, authorization: str | None) -> str | web.Response:
        """The tenant an Authorization header names ("" without keys); the
        401 to answer instead, if any."""
        who = self.who(authorization)
        if who is None:
            if bearer(authorization) is None:
                return unauthorized("You didn't provide an API key. Provide it in the "
                                    "Authorization header as 'Bearer YOUR_KEY'.")
            return unauthorized("Incorrect API key provided.")
        return who
