"""Where tenants' API keys come from, kept current without a restart: a
YAML file (``kind: APIKeys``) re-read when it changes, or a Kubernetes
Secret watched like the pod discovery (a ``kubeapi.Reflector``: one LIST,
then a WATCH resumed from its resourceVersion). Either yields one table, key digest -> tenant;
a bad new version is logged and the last good table kept. The source runs
under the router's supervisor (``toposerve.router.supervise``): a Secret
that cannot be read (no apiserver, a kubeconfig gone bad, an answer of a
shape not expected) is logged once a streak, saying that every request
gets 401 while no table has been read, counted, and tried again after a
backoff."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, model_validator

from toposerve.kubeapi import JsonApi, Reflector, connect
from toposerve.router.config import KeysConfig, SecretKeys
from toposerve.router.supervise import Streak, in_thread, supervise
from toposerve.topology.config_file import ConfigError, load_file

log = structlog.get_logger("router.admission.keys")

KeyTable = dict[bytes, str]  # sha256 of the key -> tenant


def digest(key: str) -> bytes:
    """Keys are looked up by digest: a dict probe on a hash leaks nothing of
    how much of a guessed key was right, and no key is kept in memory."""
    return hashlib.sha256(key.encode()).digest()


def table(tenants: Mapping[str, list[str]]) -> KeyTable:
    out: KeyTable = {}
    for tenant, keys in tenants.items():
        for k in keys:
            d = digest(k)
            if out.get(d, tenant) != tenant:
                raise ValueError(f"tenants.{tenant}: a key is also {out[d]}'s; give each key "
                                 "one tenant")
            out[d] = tenant
    return out


class APIKeysFile(BaseModel):
    """The key file: each tenant with its API keys."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)
    api_version: Literal["toposerve.io/v1"] = Field(alias="apiVersion")
    kind: Literal["APIKeys"]
    tenants: dict[str, list[str]] = Field(description="tenant -> its keys")

    @model_validator(mode="after")
    def _keys(self) -> APIKeysFile:
        for tenant, keys in self.tenants.items():
            if not tenant or any(not k.strip() or k != k.strip() for k in keys):
                raise ValueError(f"tenants.{tenant or '(empty name)'}: a tenant needs a name "
                                 "and keys without blanks around them")
        table(self.tenants)
        return self


def read_file(path: str) -> KeyTable:
    return table(load_file(path, APIKeysFile, "APIKeys").tenants)


def secret_table(data: Mapping[str, str] | None) -> KeyTable:
    """A Secret's data: each entry a tenant, its value (base64, as the API
    gives it) the tenant's keys, one a line."""
    if data is not None and not (isinstance(data, Mapping)
                                 and all(isinstance(v, str) for v in data.values())):
        raise ValueError("its data is not a map of tenant to base64 text")
    tenants = {t: [k.strip() for k in base64.b64decode(v).decode().splitlines() if k.strip()]
               for t, v in (data or {}).items()}
    return table(tenants)


class KeySource:
    """Keeps ``on_change`` fed with the current table: at once, then after
    every change."""

    def __init__(self, cfg: KeysConfig, on_change: Callable[[KeyTable], None]) -> None:
        self.cfg, self.on_change = cfg, on_change
        self.loaded = False  # a table was read: until then every request gets 401
        where = ({"file": cfg.file} if cfg.file is not None else
                 {"secret": f"{cfg.secret.namespace}/{cfg.secret.name}"} if cfg.secret else {})
        self._streak = Streak("api-keys", self._effect, **where)

    def _effect(self) -> str | None:
        return None if self.loaded else ("no API keys read yet: every request is answered "
                                          "401 until they are")

    def _changed(self, keys: KeyTable) -> None:
        self.loaded = True
        self.on_change(keys)

    def load_now(self) -> None:
        """The file's table before the server starts: a bad file fails the start."""
        if self.cfg.file is not None:
            try:
                self._changed(read_file(self.cfg.file))
            except ValueError as err:
                raise ConfigError(f"flowControl.tenants.keys.file: {err}") from None

    async def run(self) -> None:
        """Keeps the table current until cancelled."""
        if self.cfg.file is not None:
            file, every_s = self.cfg.file, self.cfg.reload_s
            await supervise(self._streak, lambda: self._poll(file, every_s))
        elif (secret := self.cfg.secret) is not None:
            await supervise(self._streak, lambda: self._watch_secret(secret))

    async def _watch_secret(self, s: SecretKeys) -> None:
        reflector = self._watch(s, connect(s.kubeconfig), asyncio.get_running_loop())
        try:
            await in_thread(reflector.run, "key-secret-watch")
        finally:  # cancelled too: the thread's watch ends with it
            reflector.stop()

    async def _poll(self, path: str, every_s: float) -> None:
        # a stat a second is cheap and sees an atomic replace, as a mounted
        # ConfigMap or Secret makes with its symlink swap, where a watch on
        # the file's inode would not
        seen = _stamp(path)
        while True:
            await asyncio.sleep(every_s)
            now = _stamp(path)
            if now == seen:
                continue
            seen = now
            try:
                self._changed(read_file(path))
                log.info("api keys reloaded", file=path)
            except ValueError as err:
                log.error("api keys not reloaded: the file is invalid; the last good keys stay",
                          file=path, error=str(err))
            self._streak.ok()

    def _watch(self, s: SecretKeys, api: Any, loop: asyncio.AbstractEventLoop) -> Reflector:
        def apply(data: Mapping[str, str] | None) -> None:
            self._streak.ok()  # the apiserver answered
            try:
                t = secret_table(data)
            except ValueError as err:
                log.error("api keys not reloaded: the secret is invalid; the last good keys "
                          "stay", secret=f"{s.namespace}/{s.name}", error=str(err))
                return
            loop.call_soon_threadsafe(self._changed, t)

        return Reflector(
            JsonApi(api), f"/api/v1/namespaces/{s.namespace}/secrets",
            [("fieldSelector", f"metadata.name={s.name}")],
            on_list=lambda found, _rv: apply(found[0].get("data") if found else None),
            on_event=lambda kind, obj: apply(None if kind == "DELETED" else obj.get("data")),
            on_error=self._streak.failed)


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(Path(path))
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size
