"""The shared verifying TLS contexts (daemon/net/tls.py)."""

from __future__ import annotations

import ssl

import httpx

from daemon.net import tls


def test_one_context_a_kind_and_it_verifies() -> None:
    context = tls.verifying()
    assert tls.verifying() is context and tls.verifying(trust_env=True) is context
    assert tls.verifying(trust_env=False) is not context
    for made in (context, tls.verifying(trust_env=False)):
        assert made.verify_mode == ssl.CERT_REQUIRED and made.check_hostname
        assert made.cert_store_stats()["x509_ca"] > 0  # a CA bundle is loaded


def test_clients_handed_it_use_it() -> None:
    client = httpx.AsyncClient(verify=tls.verifying())
    pool = client._transport._pool  # type: ignore[attr-defined]
    assert pool._ssl_context is tls.verifying()
