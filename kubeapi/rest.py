"""Raw JSON against the apiserver."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson
import urllib3

from toposerve.kubeapi.errors import ApiError

__all__ = ["JsonApi"]


class JsonApi:
    """Raw JSON against the apiserver through the kubernetes client's
    connection pool and auth: the typed models are too slow to (de)serialize
    thousands of slices, and they would hide fields the server dropped."""

    def __init__(self, api: Any) -> None:
        self._api = api

    def _url(self, method: str, path: str, query: Sequence[tuple[str, Any]],
             accept: str = "application/json", content_type: str = "application/json"
             ) -> tuple[str, dict[str, str]]:
        _, url, headers, _, _ = self._api.param_serialize(
            method, path, query_params=list(query),
            header_params={"Accept": accept, "Content-Type": content_type},
            auth_settings=["BearerToken"])
        return url, headers

    def request(self, method: str, path: str, query: Sequence[tuple[str, Any]] = (),
                body: Any = None, timeout: float = 30, accept: str = "application/json",
                content_type: str = "application/json") -> Any:
        """``content_type``: a PATCH names its kind (e.g. merge-patch+json)."""
        r = self._send(method, path, query, body, timeout, accept, content_type)
        try:
            return orjson.loads(r.data) if r.data else {}
        except orjson.JSONDecodeError:
            raise ApiError(r.status, f"{method} {path}: an answer that is not JSON") from None

    def text(self, path: str, timeout: float = 60) -> str:
        """A GET whose answer is text (``/metrics``)."""
        return str(self._send("GET", path, (), None, timeout, "text/plain",
                              "application/json").data.decode())

    def _send(self, method: str, path: str, query: Sequence[tuple[str, Any]], body: Any,
              timeout: float, accept: str, content_type: str) -> Any:
        url, headers = self._url(method, path, query, accept, content_type)
        try:
            r = self._api.rest_client.pool_manager.request(
                method, url, headers=headers, retries=False,
                body=None if body is None else orjson.dumps(body),
                timeout=urllib3.Timeout(connect=min(5, timeout), read=timeout))
        except urllib3.exceptions.HTTPError as err:
            raise ApiError(0, f"{method} {path}: {type(err).__name__}: {err}") from None
        if r.status >= 300:
            try:
                data = orjson.loads(r.data) if r.data else {}
            except orjson.JSONDecodeError:
                data = {}
            msg = data.get("message", r.reason) if isinstance(data, dict) else r.reason
            raise ApiError(r.status, f"{method} {path}: {msg}")
        return r

    def stream(self, path: str, query: Sequence[tuple[str, Any]], read_timeout: float,
               opened: Callable[[Any], None]) -> Iterator[dict[str, Any]]:
        """Watch events, one JSON object a line; ``opened`` gets the
        response so another thread can shut it down."""
        url, headers = self._url("GET", path, query)
        try:
            r = self._api.rest_client.pool_manager.request(
                "GET", url, headers=headers, retries=False, preload_content=False,
                timeout=urllib3.Timeout(connect=5, read=read_timeout))
        except urllib3.exceptions.HTTPError as err:
            raise ApiError(0, f"watch {path}: {type(err).__name__}: {err}") from None
        opened(r)
        try:
            if r.status >= 300:
                body = r.read()
                msg = orjson.loads(body).get("message", r.reason) if body else r.reason
                raise ApiError(r.status, f"watch {path}: {msg}")
            for line in r:
                if line.strip():
                    yield orjson.loads(line)
        except (urllib3.exceptions.HTTPError, OSError, orjson.JSONDecodeError) as err:
            # a broken line too (seen once in a 1,000-node run): the caller
            # watches again from the last resourceVersion it saw
            raise ApiError(0, f"watch {path}: {type(err).__name__}: {err}") from None
        finally:
            r.release_conn()
