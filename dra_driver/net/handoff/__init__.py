"""Handing NICs into pod network namespaces and back: the journalled mover
(``mover``), the netlink edge it drives (``links``), its journal
(``journal``) and the CNI plugin chained after the pod network (``cni``)."""

from pathlib import Path

# Where the toposerve image has the static ``toposerve-nic`` binary (the
# Containerfile's COPY; tests hold them equal): what the NIC driver's init
# container installs unless told otherwise (``netDriver.cni.plugin``,
# ``toposerve driver net-install-cni --plugin``).
DEFAULT_PLUGIN = Path("/opt/toposerve/bin/toposerve-nic")
