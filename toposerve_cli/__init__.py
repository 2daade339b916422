"""The ``toposerve`` command line."""
