"""The OpenAI-compatible router. Its subpackages follow a request's path:
``http`` takes it in (the edge makes its ``exchange``, the one object that
carries a request's state; the handlers read it; the director runs its
stages: admit, schedule, relay, settle; ``app`` wires the parts),
``request`` is what the scheduler knows of it, ``admission`` may hold it while every endpoint is
saturated, ``scheduling`` ranks the endpoints by a profile of filters,
scorers and a picker, reading the ``prefix`` indexes and the endpoint
``pool`` (its scraped load, saturation and discovery), ``relay`` forwards
it to the endpoint that answers, ``disaggregation`` splits it between a
prefill and a decode endpoint, ``responses`` keeps Responses-API turns,
and ``ha`` lets router replicas and workers share one view (all serving,
or a hot-standby pair); ``epp`` is a second edge
over the same parts and stages, asked by a proxy (Envoy's external
processing) which endpoint serves each request. ``config`` and
``metrics`` are shared by all of them, and ``supervise`` keeps every
background loop running past bad input; ``docgen`` writes their reference pages. The
formats it shares with the model servers live in ``wire``."""

# Layers, top to bottom: a module imports only from its own package or a
# layer below it; packages sharing a line import neither each other.
#   epp
#   http | docgen
#   ha | disaggregation | responses
#   relay
#   exchange
#   admission | scheduling
#   metrics
#   state
#   prefix
#   request
#   pool
#   config | supervise
# Outside the router it imports only topology, wire and kubeapi.
