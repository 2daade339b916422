"""The ``kubernetes`` client's generated API classes and its error, for the
calls that want its typed models (a Node's labels and allocatable) or its
request options (a server-side apply's field manager); the rest of the
product speaks raw JSON through ``JsonApi``. Every part takes them from here,
so this layer is the only importer of ``kubernetes`` (a contract in
pyproject.toml). ``toposerve.kubeapi`` itself does not import this module:
loading the client costs a quarter of a second that a part which never
talks to the cluster should not pay."""

from __future__ import annotations

from kubernetes.client import ApiClient, CoreV1Api, ResourceV1Api
from kubernetes.client.exceptions import ApiException

__all__ = ["ApiClient", "ApiException", "CoreV1Api", "ResourceV1Api"]
