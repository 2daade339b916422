"""API keys against a real router: a missing or unknown key is 401 in
OpenAI's error shape, probes need none, and the key file is re-read when
it changes, without a restart."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml

from harness.procs import MODEL, Procs
from harness.waiting import wait_for


def _keys(path: Path, tenants: dict[str, list[str]]) -> None:
    # written aside and renamed, as a mounted Secret or ConfigMap changes
    tmp = path.with_suffix(".new")
    tmp.write_text(yaml.safe_dump({"apiVersion": "toposerve.io/v1", "kind": "APIKeys",
                                   "tenants": tenants}))
    tmp.replace(path)


def _post(url: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.post(url + "/v1/completions", headers=headers, timeout=30,
                      json={"model": MODEL, "prompt": "hi", "max_tokens": 1})


def test_keys_401_and_file_reload(procs: Procs, tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    _keys(keys, {"team-a": ["sk-a"], "team-b": ["sk-b"]})
    sim = procs.sim()
    router = procs.router({"flowControl": {"tenants": {
        "keys": {"file": str(keys), "reloadSeconds": 0.1},
        "tenants": [{"name": "team-a", "requestsPerSecond": 1000}]}}}, endpoints=[sim.url])
    assert _post(router.url, "sk-a").status_code == 200
    assert _post(router.url, "sk-b").status_code == 200
    for key, says in [(None, "didn't provide an API key"), ("sk-nope", "Incorrect API key")]:
        r = _post(router.url, key)
        assert r.status_code == 401, r.text
        err = r.json()["error"]
        assert says in err["message"]
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_api_key"
    r = httpx.post(router.url + "/v1/chat/completions", timeout=10,
                   headers={"Authorization": "Basic c2stYQ=="},
                   json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 401
    # probes and scrapes carry no key
    assert httpx.get(router.url + "/health").status_code == 200
    assert httpx.get(router.url + "/ready").status_code == 200
    assert router.metric("toposerve_router_api_keys") == 2
    # a new key for team-a, team-b's taken away: applied without a restart
    _keys(keys, {"team-a": ["sk-a", "sk-a2"]})
    wait_for("the new key", lambda: _post(router.url, "sk-a2").status_code == 200)
    assert _post(router.url, "sk-b").status_code == 401
    # a broken file keeps the last good keys
    keys.write_text("apiVersion: toposerve.io/v1\nkind: APIKeys\ntenants: [oops]\n")
    wait_for("the broken file to be seen",
             lambda: "api keys not reloaded" in router.log.read_text())
    assert _post(router.url, "sk-a").status_code == 200
    assert router.popen.poll() is None
