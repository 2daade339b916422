"""Responses-API state: the stored turns that let a ``previous_response_id``
chain continue on any endpoint, in memory or in Redis (``store``), and the
relay that keeps a streamed turn as it passes (``relay``)."""
