"""The kubelet's gRPC contracts as .proto files, written from docs/design.md §4.

``python -m toposerve.dra_driver.protos.generate`` (``make protos``) writes the Python
stubs into ``dra_driver/_generated``."""
