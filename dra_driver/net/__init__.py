"""The network driver ``net.toposerve.io`` (DRANET-style): NIC devices."""
