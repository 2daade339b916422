"""Placement decisions as pure functions: a pod's group (``groups``), levels,
the model of a decision, packing, and choosing a domain where the whole
group fits (``decide``)."""
