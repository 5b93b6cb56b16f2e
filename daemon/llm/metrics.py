# The LLM service's Prometheus metrics, per provider (the name in [llm], "default" for [llm]
# itself): requests by outcome, tokens in and out as the server counted them, latency of the
# requests that got an answer, cache hits and what is in flight.
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from daemon.metrics import REGISTRY

requests = Counter(
    "crawld_llm_requests",
    "Requests sent to a model endpoint, by outcome (ok, rate_limited, server_error, timeout,"
    " unreachable, refused_mode, bad_request, bad_output)",
    ["provider", "outcome"],
    registry=REGISTRY,
)
tokens = Counter(
    "crawld_llm_tokens",
    "Tokens counted by the endpoint's `usage`, by direction (in: prompt, out: completion)",
    ["provider", "direction"],
    registry=REGISTRY,
)
latency = Histogram(
    "crawld_llm_request_seconds",
    "Time from sending a request to the end of its answer",
    ["provider"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
    registry=REGISTRY,
)
calls = Counter(
    "crawld_llm_calls",
    "extract_json / summarize calls by result (ok, cached, and the LLM_* error codes)",
    ["provider", "kind", "result"],
    registry=REGISTRY,
)
in_flight = Gauge(
    "crawld_llm_in_flight",
    "Requests in flight to a model endpoint",
    ["provider"],
    registry=REGISTRY,
)
