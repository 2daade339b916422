"""Prefill/decode disaggregation: picking the two endpoints of a split
request, the decode one near the prefill one in the topology, and the
bodies each gets (``pairing``); playing vLLM's NIXL or SGLang's bootstrap
hand-over over the proxy, with a local prefill when it fails (``split``)."""
