"""Picking endpoints: a profile of filters, weighted scorers and a picker
(``profile``), built from config by type name (``registry``, made from the
plugin classes, each declaring its name, params and how it is built:
``plugins``); what one profile run shares between its plugins (``cycle``);
the plugins themselves (``filters``, ``scorers`` a module a concern,
``pickers``) and their pure scoring maths (``scoring``). What the scheduler
knows of a request is ``toposerve.router.request``."""
