"""Where prompts' prefixes are cached: a per-endpoint LRU of block keys with
a reverse map (``index``), fed either by where the router sent earlier
prompts (the approximate index) or by the endpoints' KV events over ZMQ,
re-keyed from their token ids (``kv_index``, the precise index)."""
