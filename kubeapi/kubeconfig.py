"""What the ``kubernetes`` client's loader reads of a kubeconfig, checked
before it reads it: the loader trusts every field's type and every
``*-data`` field's base64 and fails with whatever Python raises where it
trips (a TypeError for ``clusters: 5``, a binascii.Error for bad base64).
As client-go (kubectl) decodes the whole file into typed structs, every
entry is checked, used by the current context or not; fields the client
never reads (extensions, preferences) are let through."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, ValidationError

__all__ = ["problem"]


def _base64(value: str) -> str:
    try:  # Go's base64.StdEncoding, which skips line breaks
        base64.b64decode("".join(value.split()), validate=True)
    except binascii.Error as err:
        raise ValueError(f"not base64 ({err})") from None
    return value


Base64 = Annotated[str, AfterValidator(_base64)]


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Cluster(_Part):
    server: str | None = None
    certificate_authority: str | None = Field(default=None, alias="certificate-authority")
    certificate_authority_data: Base64 | None = Field(default=None,
                                                      alias="certificate-authority-data")
    insecure_skip_tls_verify: StrictBool | None = Field(default=None,
                                                        alias="insecure-skip-tls-verify")
    tls_server_name: str | None = Field(default=None, alias="tls-server-name")
    proxy_url: str | None = Field(default=None, alias="proxy-url")


class _User(_Part):
    token: str | None = None
    token_file: str | None = Field(default=None, alias="tokenFile")
    client_certificate: str | None = Field(default=None, alias="client-certificate")
    client_certificate_data: Base64 | None = Field(default=None, alias="client-certificate-data")
    client_key: str | None = Field(default=None, alias="client-key")
    client_key_data: Base64 | None = Field(default=None, alias="client-key-data")
    username: str | None = None
    password: str | None = None
    exec_: dict[str, Any] | None = Field(default=None, alias="exec")
    auth_provider: dict[str, Any] | None = Field(default=None, alias="auth-provider")


class _Context(_Part):
    cluster: str | None = None
    user: str | None = None
    namespace: str | None = None


class _NamedCluster(_Part):
    name: str
    cluster: _Cluster | None = None


class _NamedUser(_Part):
    name: str
    user: _User | None = None


class _NamedContext(_Part):
    name: str
    context: _Context | None = None


class _Kubeconfig(_Part):
    clusters: list[_NamedCluster] | None = None
    users: list[_NamedUser] | None = None
    contexts: list[_NamedContext] | None = None
    current_context: str | None = Field(default=None, alias="current-context")


def _where(loc: tuple[int | str, ...]) -> str:
    """``clusters[0].cluster.server`` for ``("clusters", 0, "cluster", "server")``."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def problem(doc: dict[str, Any]) -> str | None:
    """What is wrong with the kubeconfig ``doc`` (a YAML mapping), in words
    naming the field, or None when the loader can read it."""
    try:
        _Kubeconfig.model_validate(doc)
    except ValidationError as err:
        first, *rest = err.errors()
        what = str(first["ctx"]["error"]) if first["type"] == "value_error" else first["msg"]
        more = f" (and {len(rest)} more)" if rest else ""
        return f"{_where(first['loc'])}: {what}{more}"
    return None
