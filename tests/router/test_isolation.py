"""A tenant sees only its own stored responses, on either replica of a
pair sharing one Redis: with another tenant's API key, `GET
/v1/responses/{id}` and `previous_response_id` answer 404, as if the id
did not exist. Tenants come from real keys (a key file, the tenants
middleware)."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml

from harness.procs import MODEL, Procs

KEYS = {"red": ["sk-red-1"], "blue": ["sk-blue-1"]}


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant][0]}"}


def test_other_tenants_responses_are_404_on_either_replica(
        procs: Procs, redis_url: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"apiVersion": "toposerve.io/v1", "kind": "APIKeys",
                                    "tenants": KEYS}))
    sim = procs.sim()
    cfg = {"responses": {"backend": "redis", "redisUrl": redis_url},
           "flowControl": {"tenants": {"keys": {"file": str(keys)}}}}
    a, b = (procs.router(cfg, endpoints=[sim.url]) for _ in range(2))
    r = httpx.post(a.url + "/v1/responses", headers=auth("red"), timeout=30,
                   json={"model": MODEL, "input": "hello", "max_output_tokens": 2})
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    for replica in (a, b):
        url = f"{replica.url}/v1/responses/{rid}"
        assert httpx.get(url, headers=auth("red")).status_code == 200
        other = httpx.get(url, headers=auth("blue"))
        assert other.status_code == 404
        assert "not found" in other.json()["error"]["message"]
        assert httpx.get(url).status_code == 401  # no key at all
        chain = {"model": MODEL, "input": "more", "previous_response_id": rid,
                 "max_output_tokens": 2}
        assert httpx.post(replica.url + "/v1/responses", headers=auth("blue"), json=chain,
                          timeout=30).status_code == 404
        own = httpx.post(replica.url + "/v1/responses", headers=auth("red"), json=chain,
                         timeout=30)
        assert own.status_code == 200, own.text
