"""What the router and the model servers it fronts both speak, in one place
so that the router and the simulator cannot drift apart: the OpenAI request
models and error bodies (``openai``, ``errors``), the canonical prompt both
hash and tokenize (``prompt``, ``tokens``), chained block hashes
(``hashing``), vLLM's KV-cache events, encoded and decoded (``kv_events``),
the prefill/decode hand-over fields (``kv_transfer``), and the addresses a
model server is dialled at, checked where a configuration names them
(``addresses``)."""
