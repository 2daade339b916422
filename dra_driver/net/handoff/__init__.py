"""Handing NICs into pod network namespaces and back: the journalled mover
(``mover``), the netlink edge it drives (``links``), its journal
(``journal``) and the CNI plugin chained after the pod network (``cni``)."""
