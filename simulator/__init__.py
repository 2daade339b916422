"""A model server that stands in for vLLM and SGLang in tests, the demo and
the benchmarks: their HTTP surface, metric names and KV events, with a
latency model instead of a GPU (``engine``). It is not part of the router:
the two share only ``wire``, the formats both sides speak."""
