"""A kubelet-plugin framework for DRA drivers in Python: what Go drivers get
from ``k8s.io/dynamic-resource-allocation/kubeletplugin``. Knows nothing of
GPUs or NICs; a device kind (``device_kind.DeviceKind``) plugs in."""
