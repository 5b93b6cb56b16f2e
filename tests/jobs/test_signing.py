from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from daemon.jobs.signing import (
    attempt_headers,
    firecrawl_signature,
    redact,
    standard_key,
    standard_signature,
)
from daemon.jobs.verify import (
    WebhookVerificationError,
    verify,
    verify_firecrawl,
    verify_standard,
)

# Published Standard Webhooks test vector (reference libraries' tests).
SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SW_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SW_TS = 1614265330
SW_BODY = b'{"test": 2432232314}'
SW_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

BODY = b'{"success":true,"type":"crawl.page","id":"j","webhookId":"w1","seq":1}'
NOW = 1_760_000_000


def test_standard_webhooks_vector() -> None:
    assert standard_signature(SW_SECRET, SW_ID, SW_TS, SW_BODY) == SW_SIG
    headers = {"webhook-id": SW_ID, "webhook-timestamp": str(SW_TS), "webhook-signature": SW_SIG}
    verify_standard(SW_SECRET, SW_BODY, headers, now=SW_TS)


def test_firecrawl_signature_known_answer() -> None:
    # HMAC-SHA256 example from RFC 4231 test case 2 (key "Jefe").
    assert firecrawl_signature("Jefe", b"what do ya want for nothing?") == (
        "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    )


def test_firecrawl_signature_uses_the_whsec_secret_as_configured() -> None:
    expected = hmac.new(SW_SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    assert firecrawl_signature(SW_SECRET, BODY) == f"sha256={expected}"


def test_plain_secret_is_used_as_utf8_bytes_for_standard_signature() -> None:
    assert standard_key("plain secret") == b"plain secret"
    digest = hmac.new(b"plain secret", b"w1.1700000000." + BODY, hashlib.sha256).digest()
    assert standard_signature("plain secret", "w1", 1700000000, BODY) == (
        "v1," + base64.b64encode(digest).decode()
    )


def test_whsec_secret_is_base64_decoded() -> None:
    assert standard_key("whsec_" + base64.b64encode(b"\x00key").decode()) == b"\x00key"
    with pytest.raises(ValueError, match="base64"):
        standard_key("whsec_not base64!")


def test_webhook_id_with_a_dot_is_refused() -> None:
    with pytest.raises(ValueError):
        standard_signature("s", "a.b", NOW, BODY)


def test_attempt_headers_without_secret() -> None:
    headers = attempt_headers(BODY, webhook_id="w1", timestamp=NOW, secret=None)
    assert headers == {
        "User-Agent": "crawld-webhooks/1",
        "Content-Type": "application/json",
        "webhook-id": "w1",
        "webhook-timestamp": str(NOW),
    }


def test_attempt_headers_with_secret_and_user_headers() -> None:
    headers = attempt_headers(
        BODY,
        webhook_id="w1",
        timestamp=NOW,
        secret="s3cret",
        event_type="crawl.page",
        job_id="j",
        user_headers={
            "Authorization": "Bearer t",
            "User-Agent": "mine",
            "X-Firecrawl-Signature": "forged",
            "Webhook-Id": "forged",
            "content-type": "text/plain",
        },
    )
    assert headers["Authorization"] == "Bearer t"
    assert headers["User-Agent"] == "mine"
    assert "Webhook-Id" not in headers and "content-type" not in headers
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Firecrawl-Event"] == "crawl.page"
    assert headers["X-Firecrawl-Job-Id"] == "j"
    assert headers["X-Firecrawl-Signature"] == firecrawl_signature("s3cret", BODY)
    assert headers["webhook-signature"] == standard_signature("s3cret", "w1", NOW, BODY)
    verify("s3cret", BODY, headers, now=NOW)


def test_retry_keeps_id_and_changes_timestamp_and_signature() -> None:
    first = attempt_headers(BODY, webhook_id="w1", timestamp=NOW, secret="k")
    second = attempt_headers(BODY, webhook_id="w1", timestamp=NOW + 60, secret="k")
    assert first["webhook-id"] == second["webhook-id"]
    assert first["X-Firecrawl-Signature"] == second["X-Firecrawl-Signature"]
    assert first["webhook-signature"] != second["webhook-signature"]
    verify("k", BODY, second, now=NOW + 61)


def test_rotation_sends_one_entry_per_secret() -> None:
    headers = attempt_headers(
        BODY, webhook_id="w1", timestamp=NOW, secret="new", previous_secrets=["old"]
    )
    assert len(headers["webhook-signature"].split()) == 2
    verify_standard("new", BODY, headers, now=NOW)
    verify_standard("old", BODY, headers, now=NOW)
    with pytest.raises(WebhookVerificationError):
        verify_standard("other", BODY, headers, now=NOW)


def test_round_trip_with_whsec_secret() -> None:
    headers = attempt_headers(BODY, webhook_id="w1", timestamp=NOW, secret=SW_SECRET)
    verify(SW_SECRET, BODY, headers, now=NOW)


def _signed(secret: str = "k", ts: int = NOW) -> dict[str, str]:
    return attempt_headers(BODY, webhook_id="w1", timestamp=ts, secret=secret)


@pytest.mark.parametrize(
    ("secret", "body", "change", "now", "message"),
    [
        ("k", BODY + b" ", {}, NOW, "does not match|no webhook-signature"),
        ("other", BODY, {}, NOW, "no webhook-signature entry"),
        ("k", BODY, {}, NOW + 301, "too old"),
        ("k", BODY, {}, NOW - 301, "too new"),
        ("k", BODY, {"webhook-timestamp": "soon"}, NOW, "not an integer"),
        ("k", BODY, {"webhook-id": "w2"}, NOW, "no webhook-signature entry"),
        ("k", BODY, {"webhook-signature": "v2,abc"}, NOW, "no webhook-signature entry"),
        ("k", BODY, {"X-Firecrawl-Signature": "sha256=00"}, NOW, "X-Firecrawl-Signature"),
        ("k", BODY, {"X-Firecrawl-Signature": "md5=00"}, NOW, "not sha256"),
    ],
)
def test_verify_rejects(
    secret: str, body: bytes, change: dict[str, str], now: int, message: str
) -> None:
    headers = {**_signed(), **change}
    with pytest.raises(WebhookVerificationError, match=message):
        verify(secret, body, headers, now=now)


def test_verify_within_tolerance_both_ways() -> None:
    verify("k", BODY, _signed(), now=NOW + 300)
    verify("k", BODY, _signed(), now=NOW - 300)
    verify("k", BODY, _signed(), now=NOW + 30, tolerance=60)


def test_verify_needs_a_signature() -> None:
    headers = attempt_headers(BODY, webhook_id="w1", timestamp=NOW, secret=None)
    with pytest.raises(WebhookVerificationError, match="not signed"):
        verify("k", BODY, headers, now=NOW)


def test_verify_accepts_firecrawl_header_alone_in_any_case() -> None:
    verify("k", BODY, {"x-firecrawl-signature": firecrawl_signature("k", BODY)})
    verify_firecrawl("k", BODY, firecrawl_signature("k", BODY).upper().replace("SHA256", "sha256"))
    with pytest.raises(WebhookVerificationError, match="missing"):
        verify_firecrawl("k", BODY, None)


def test_verify_standard_reads_headers_case_insensitively() -> None:
    headers = {k.upper(): v for k, v in _signed().items()}
    verify_standard("k", BODY, headers, now=NOW)


def test_redact_hides_signatures_and_user_values() -> None:
    headers = attempt_headers(
        BODY, webhook_id="w1", timestamp=NOW, secret="k", user_headers={"Authorization": "t"}
    )
    shown = redact(headers)
    assert shown["X-Firecrawl-Signature"] == "<redacted>"
    assert shown["webhook-signature"] == "<redacted>"
    assert shown["Authorization"] == "<redacted>"
    assert shown["webhook-id"] == "w1"


def test_verify_can_require_the_timestamped_signature() -> None:
    firecrawl_only = {"X-Firecrawl-Signature": firecrawl_signature("k", BODY)}
    with pytest.raises(WebhookVerificationError, match="can be replayed"):
        verify("k", BODY, firecrawl_only, now=NOW, require_timestamped=True)
    verify("k", BODY, _signed(), now=NOW, require_timestamped=True)  # crawld sends both
    stale = _signed()
    with pytest.raises(WebhookVerificationError, match="too old"):
        verify("k", BODY, stale, now=NOW + 301, require_timestamped=True)
