"""Picking endpoints: a profile of filters, weighted scorers and a picker
(``profile``), built from config by type name (``registry``); what one
profile run shares between its plugins (``cycle``); the plugins themselves
and their pure scoring maths. What the scheduler knows of a request is
``toposerve.router.request``."""
