"""The OpenAI-compatible router. Its subpackages follow a request's path:
``http`` takes it in (the aiohttp app, its handlers, and the proxy that
forwards to the endpoint that answers), ``admission`` may hold it while
every endpoint is saturated, ``scheduling`` ranks the endpoints by a
profile of filters, scorers and a picker, reading the ``prefix`` indexes
and the endpoint ``pool`` (its scraped load and its discovery),
``disaggregation`` splits it between a prefill and a decode endpoint, and
``responses`` keeps Responses-API turns. ``config`` and ``metrics`` are
shared by all of them; ``docgen`` writes their reference pages. The
formats it shares with the model servers live in ``wire``."""
