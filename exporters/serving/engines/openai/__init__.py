"""The ``openai`` engine: a transparent proxy to any OpenAI-compatible upstream (docs/serving.md).

One module per part:

- ``engine``: ``OpenAIProxyEngine``, the Engine (requests, retries, models, adapters, health);
- ``stream``: one request's stream: delivery to the HTTP layer, back-pressure, timing marks;
- ``frames``: the pure SSE frame accounting of a streamed response (tokens, usage, finish, forwarded frames);
- ``errors``: upstream failures translated into EngineErrors, retry and failure reasons;
- ``metrics``: the proxy's own series;
- ``upstream_http``, ``upstream_connection``, ``upstream_pool``: its streaming HTTP/1.1 client;
- ``upstream_kinds``: what it knows of each kind of upstream;
- ``swap_windows``, ``probe_swap_feed``: LoRA swap windows and the blocking they cause.
"""
