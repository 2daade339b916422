"""Admission and flow control on llm-d's headers: objectives with
priorities, sheddable requests refused under saturation, and a fair queue
in the router (priority first, flows of one priority in turn) that lets a
request go when an endpoint has room (``flow_control``)."""
