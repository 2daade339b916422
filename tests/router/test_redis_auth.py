"""The router and a real redis-server: a Redis that answers without a
password stops the router's start unless its config allows it in so many
words; with the password from a file (a mounted Secret, as the install
gives it) the store and the replication work."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
import yaml

from harness import redis_proc
from harness.waiting import wait_for
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.processes import end_process
from toposerve.router.config import ResponsesStoreConfig
from toposerve.router.ha.bus import RedisBus
from toposerve.router.responses.store import ResponsesStore, make_store
from toposerve.topology.config_file import ConfigError
from toposerve.wire.errors import ApiError


@pytest.fixture
def open_redis(tmp_path: Path) -> Iterator[str]:
    url, p = redis_proc.start(workdir=tmp_path)
    try:
        yield url
    finally:
        end_process(p, 10)


def _store(**fields: object) -> ResponsesStoreConfig:
    return ResponsesStoreConfig.model_validate({"backend": "redis", **fields})


def test_an_open_redis_stops_the_router_start(open_redis: str, tmp_path: Path) -> None:
    cfg = {"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
           "server": {"host": "127.0.0.1", "port": free_port()},
           "discovery": {"static": [{"url": "http://127.0.0.1:1"}]},
           "responses": {"backend": "redis", "redisUrl": open_redis}}
    (tmp_path / "router.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "toposerve.main", "router",
                           f"--config={tmp_path / 'router.yaml'}"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (f"responses.redisUrl {open_redis}: this Redis answers without a password"
            in proc.stderr), proc.stderr[-2000:]
    assert "responses.allowUnauthenticated: true" in proc.stderr


def test_an_open_redis_is_refused_even_with_a_password_configured(
        open_redis: str, tmp_path: Path) -> None:
    """The router's password does not make an open Redis safe: the probe is
    sent without it (and without one in the URL)."""
    (tmp_path / "pw").write_text("s3cret\n")
    with_pw = open_redis.replace("redis://", "redis://:s3cret@")
    for cfg in (_store(redisUrl=open_redis, redisPasswordFile=str(tmp_path / "pw")),
                _store(redisUrl=with_pw)):
        with pytest.raises(ConfigError, match="answers without a password"):
            make_store(cfg)


def test_allow_unauthenticated_lets_an_open_redis_in(open_redis: str) -> None:
    store = make_store(_store(redisUrl=open_redis, allowUnauthenticated=True))

    async def roundtrip() -> object:
        try:
            await store.put("r1", {"x": 1}, "t")
            return await store.get("r1", "t")
        finally:
            await store.close()

    assert asyncio.run(roundtrip()) == {"x": 1, "tenant": "t"}


def test_password_file_authenticates_store_and_replication(
        redis_url: str, tmp_path: Path) -> None:
    """The install's way: a password-protected Redis, the URL without the
    password, the password in a mounted file."""
    u = urlsplit(redis_url)
    bare = redis_url.replace(f":{u.password}@", "")
    (tmp_path / "pw").write_text(f"{u.password}\n")
    missing = _store(redisUrl=bare, redisPasswordFile=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="redisPasswordFile: cannot read"):
        make_store(missing)
    cfg = _store(redisUrl=bare, redisPasswordFile=str(tmp_path / "pw"))
    store = make_store(cfg)  # it needs a password: no refusal

    async def roundtrip() -> object:
        bus = RedisBus(bare, "toposerve:test", cfg.redis_options())
        try:
            await store.put("r1", {"x": 1}, "t")
            await bus.ping()  # authenticated, else NOAUTH
            return await store.get("r1", "t")
        finally:
            await store.close()
            await bus.close()

    assert asyncio.run(roundtrip()) == {"x": 1, "tenant": "t"}
    # and without the file, the same Redis refuses the store's commands
    unauth = make_store(_store(redisUrl=bare))

    async def refused() -> None:
        try:
            await unauth.get("r1", "t")
        finally:
            await unauth.close()

    with pytest.raises(Exception, match="unavailable"):
        asyncio.run(refused())


def test_ca_file_needs_tls() -> None:
    with pytest.raises(ValueError, match="redisCaFile needs a TLS redisUrl"):
        _store(redisUrl="redis://127.0.0.1:6379/0", redisCaFile="/etc/ca.crt")


def _redis(tmp_path: Path, port: int, *conf: str) -> subprocess.Popen[bytes]:
    """A redis-server on ``port`` with these config lines (ACL users), up."""
    server = shutil.which("redis-server")
    assert server, "redis-server missing: `make setup` installs it (hack/install-system-deps.sh)"
    path = tmp_path / f"redis-{port}-{len(list(tmp_path.glob('redis-*.conf')))}.conf"
    path.write_text("\n".join([f"port {port}", "bind 127.0.0.1", 'save ""', "appendonly no",
                               f"dir {tmp_path}", *conf]) + "\n")
    p = subprocess.Popen([server, str(path)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)

    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for("redis to listen", up, interval=0.05)
    return p


ROUTER_USER = "user router on >router-pw ~toposerve:* &* +@all"


@pytest.mark.parametrize("default", ["user default off", "user default on nopass -@all"])
def test_an_acl_user_starts_and_stores(tmp_path: Path, default: str) -> None:
    """The router's own ACL user, in the URL or with its password in a file,
    while the default user is off or may run nothing: the start check sees
    that the default user reads nothing (no traceback) and the store works."""
    port = free_port()
    p = _redis(tmp_path, port, default, ROUTER_USER)
    (tmp_path / "pw").write_text("router-pw\n")
    try:
        for n, cfg in enumerate((
                _store(redisUrl=f"redis://router:router-pw@127.0.0.1:{port}/0"),
                _store(redisUrl=f"redis://router@127.0.0.1:{port}/0",
                       redisPasswordFile=str(tmp_path / "pw")))):
            store = make_store(cfg)
            assert asyncio.run(_roundtrip(store, f"r{n}")) == {"x": 1, "tenant": "t"}
    finally:
        end_process(p, 10)


async def _roundtrip(store: ResponsesStore, rid: str = "r1") -> object:
    try:
        await store.put(rid, {"x": 1}, "t")
        return await store.get(rid, "t")
    finally:
        await store.close()


def test_a_default_user_that_reads_the_turns_is_an_open_redis(tmp_path: Path) -> None:
    """Open is what matters, not PING: a default user without a password
    that may GET the store's keys stops the start."""
    port = free_port()
    p = _redis(tmp_path, port, "user default on nopass ~* -@all +get", ROUTER_USER)
    try:
        with pytest.raises(ConfigError, match="answers without a password"):
            make_store(_store(redisUrl=f"redis://router:router-pw@127.0.0.1:{port}/0"))
    finally:
        end_process(p, 10)


def test_a_redis_unreachable_at_start_is_checked_before_turns_go_in(tmp_path: Path) -> None:
    """Nothing listens when the router starts: it starts (a router may come
    up before its Redis). An open Redis that comes up there later gets no
    turn (503); one with a password does."""
    port = free_port()
    url = f"redis://:pw@127.0.0.1:{port}/0"
    store = make_store(_store(redisUrl=url))
    p = _redis(tmp_path, port)  # open
    try:
        with pytest.raises(ApiError) as err:
            asyncio.run(_roundtrip(store))
        assert err.value.status == 503
        assert redis.Redis(port=port).dbsize() == 0  # nothing stored
    finally:
        end_process(p, 10)
    store = make_store(_store(redisUrl=url))
    p = _redis(tmp_path, port, "requirepass pw")
    try:
        assert asyncio.run(_roundtrip(store)) == {"x": 1, "tenant": "t"}
    finally:
        end_process(p, 10)


def test_a_redis_that_comes_back_open_gets_no_turns(tmp_path: Path) -> None:
    """Checked again on every new connection: the Redis restarted without
    its password (same address) gets none of the store's next puts (the
    first may fail on the connection the restart broke; the others too)."""
    port = free_port()
    url = f"redis://:pw@127.0.0.1:{port}/0"
    p = _redis(tmp_path, port, "requirepass pw")
    store = make_store(_store(redisUrl=url))

    async def puts() -> list[int]:
        statuses = []
        try:
            await store.put("r0", {"x": 0}, "t")
            end_process(p, 10)
            q = _redis(tmp_path, port)  # open, where it was
            try:
                for n in range(1, 4):
                    try:
                        await store.put(f"r{n}", {"x": n}, "t")
                        statuses.append(200)
                    except ApiError as e:
                        statuses.append(e.status)
                assert redis.Redis(port=port).dbsize() == 0
            finally:
                end_process(q, 10)
            return statuses
        finally:
            await store.close()

    try:
        assert asyncio.run(puts()) == [503, 503, 503]
    finally:
        end_process(p, 10)
