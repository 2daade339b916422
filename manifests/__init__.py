"""The install: ``values`` (the InstallValues model, which is the values'
schema and reference), jinja2 ``templates`` and ``render``, which turns
values into the Kubernetes objects of every component."""
