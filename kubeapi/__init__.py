"""The Kubernetes client layer every part shares: raw JSON requests over the
``kubernetes`` client's connection pool and auth (``rest``), one way to find
the credentials (``connect``), list-and-watch that resumes from its
resourceVersion (``reflector``), a client-go style work queue
(``workqueue``), and the client's generated API classes for the calls that
want its models or request options (``typed``, imported by name: it loads
the client). It sits on floor one beside ``topology``: it imports no other
toposerve package, and no other toposerve package imports ``kubernetes``."""

from toposerve.kubeapi.connect import ConfigError, connect
from toposerve.kubeapi.errors import ApiError
from toposerve.kubeapi.reflector import Reflector, backoff
from toposerve.kubeapi.rest import JsonApi
from toposerve.kubeapi.workqueue import WorkQueue

__all__ = ["ApiError", "ConfigError", "JsonApi", "Reflector", "WorkQueue", "backoff", "connect"]
