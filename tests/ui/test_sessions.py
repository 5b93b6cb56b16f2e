"""The console's session and CSRF rules, over plain header values with a fake clock."""

from __future__ import annotations

from daemon.ui import sessions as s


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def test_cookie_flags() -> None:
    assert s.set_cookie("t", secure=False) == (
        "crawld_session=t; Path=/; Max-Age=43200; HttpOnly; SameSite=Strict"
    )
    assert s.set_cookie("t", secure=True).endswith("; HttpOnly; SameSite=Strict; Secure")
    assert "Max-Age=0" in s.clear_cookie(secure=False)


def test_cookie_value() -> None:
    assert s.cookie_value("a=1; crawld_session=abc; b=2") == "abc"
    assert s.cookie_value("crawld_sessionx=abc") is None
    assert s.cookie_value("crawld_session=") is None
    assert s.cookie_value(None) is None


def test_session_rules() -> None:
    clock = Clock()
    store = s.Sessions(clock=clock, ttl_ms=100)
    token, session = store.create()
    cookie = {"cookie": f"crawld_session={token}"}
    assert store.refusal(cookie, "GET") is None
    assert store.refusal({}, "GET") == (
        401,
        "the console session is missing or expired: log in again",
    )
    assert store.refusal({"cookie": "crawld_session=forged"}, "GET")[0] == 401  # type: ignore[index]
    assert store.refusal(cookie, "POST")[0] == 403  # type: ignore[index]
    assert store.refusal({**cookie, "x-csrf-token": "wrong"}, "POST")[0] == 403  # type: ignore[index]
    assert store.refusal({**cookie, "x-csrf-token": session.csrf}, "POST") is None
    assert store.refusal({**cookie, "x-csrf-token": session.csrf}, "delete") is None
    clock.now += 100
    assert store.refusal(cookie, "GET")[0] == 401  # type: ignore[index]
    assert len(store) == 0


def test_csrf_of_one_session_does_not_open_another() -> None:
    store = s.Sessions(clock=Clock())
    first, _ = store.create()
    _, other = store.create()
    headers = {"cookie": f"crawld_session={first}", "x-csrf-token": other.csrf}
    assert store.refusal(headers, "POST")[0] == 403  # type: ignore[index]


def test_oldest_session_goes_past_the_cap_and_drop() -> None:
    store = s.Sessions(clock=Clock(), max_sessions=2)
    a, _ = store.create()
    b, _ = store.create()
    c, _ = store.create()
    assert store.get(a) is None and store.get(b) and store.get(c)
    store.drop(b)
    assert store.get(b) is None and len(store) == 1


def test_keyless_paths() -> None:
    store = s.Sessions()
    assert store.keyless("/ui") and store.keyless("/ui/static/app.js")
    assert store.keyless("/ui/api/login") and store.keyless("/ui/api/session")
    assert not store.keyless("/ui/api/jobs") and not store.keyless("/status")
    assert not store.keyless("/ui/api/logout")
