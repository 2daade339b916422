"""Forwarding one request upstream with failover before the first byte and
a chunk-by-chunk SSE relay after it (``proxy``), on the relay's own
HTTP/1.1 client, which pipes a stream from the upstream socket to the
client's (``upstream``). Below both the HTTP front and the prefill/decode
split, which forward through it."""
