"""Generators of the router's reference pages, from the code they describe
(so the pages cannot drift from it): ``python -m toposerve.router.docgen.config``
writes docs/router-config.md, ``python -m toposerve.router.docgen.metrics``
docs/router-metrics.md; a unit test checks both are current."""
