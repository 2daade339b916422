"""The HTTP front: the aiohttp app with the OpenAI-compatible handlers,
/health, /ready and /metrics, and the error middleware (``server``).
Forwarding to an endpoint is ``toposerve.router.relay``."""
