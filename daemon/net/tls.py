# Verifying TLS contexts built once per process and shared by the HTTPS clients crawld makes.
#
# Why: building one loads a CA bundle, about 20 ms of CPU, and httpx builds a new one for every
# client it is not handed one. crawld made several at every start (the collector's, the
# tracker's and the classifier's clients, the LLM's), and one for each webhook destination a
# job's drainer opened. A context can be shared: a connection only reads it, and the one thing
# set on it per connection, httpcore's ALPN list, is the same ("http/1.1") for every client
# here (none speaks HTTP/2). A client that verifies against a file of its own, or not at all,
# still builds its own.
from __future__ import annotations

import functools
import ssl

import httpx


def verifying(trust_env: bool = True) -> ssl.SSLContext:
    """The context httpx builds for `verify=True`: certifi's CA bundle, or with `trust_env` the
    file or folder SSL_CERT_FILE / SSL_CERT_DIR names, as httpx reads them. Built on the first
    call (do that off the event loop where it matters), the same object afterwards."""
    return _built(bool(trust_env))


@functools.cache
def _built(trust_env: bool) -> ssl.SSLContext:
    return httpx.create_ssl_context(verify=True, trust_env=trust_env)
