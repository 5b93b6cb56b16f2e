"""/openapi.json says exactly what the running daemon enforces (issue 18): security only where
a key is asked for, UUID and integer ranges on parameters, the webhook rules, the real success
status; and a 405 names the methods a path takes in `Allow`. scripts/api_fuzz.py runs
schemathesis against the whole document."""

from __future__ import annotations

import pytest

from tests.api.conftest import KEY, KEY_ENV, StartDaemon, client

NO_COLLECTOR = "[collector]\nenabled = false"


def parameters(spec: dict, method: str, path: str) -> dict[str, dict]:
    return {p["name"]: p["schema"] for p in spec["paths"][path][method].get("parameters", [])}


async def test_the_document_states_the_enforced_rules(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(extra=NO_COLLECTOR)
    async with client(daemon) as http:
        spec = (await http.get("/openapi.json")).json()
    status = parameters(spec, "get", "/v2/crawl/{id}")
    assert status["id"] == {"type": "string", "format": "uuid"}
    assert status["skip"] == {"type": "integer", "minimum": 0, "maximum": 2**31}
    assert status["limit"]["minimum"] == 1 and status["limit"]["maximum"] >= 10_000
    assert parameters(spec, "get", "/consume")["count"] == {
        "type": "integer", "minimum": 1, "maximum": 1000}  # fmt: skip
    assert parameters(spec, "get", "/tracker/videos/{aid}/snapshots")["format"]["enum"] == [
        "json", "csv"]  # fmt: skip
    assert "202" in spec["paths"]["/tracker/videos"]["post"]["responses"]
    hook = spec["components"]["schemas"]["WebhookSpec"]["properties"]
    assert hook["url"]["maxLength"] == 2048 and hook["url"]["pattern"].startswith("^https?://")
    assert hook["headers"]["maxProperties"] == 32
    # no key configured: no operation asks for one, and none lists 401
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            assert op["security"] == [], (method, path)
            assert "401" not in op["responses"], (method, path)


async def test_with_a_key_every_route_but_healthz_asks_for_it(
    start_daemon: StartDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    daemon = await start_daemon(f'api_key_env = "{KEY_ENV}"', NO_COLLECTOR)
    async with client(daemon, KEY) as http:
        spec = (await http.get("/openapi.json")).json()
    assert spec["security"] == [{"bearer": []}]
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            if path == "/healthz":
                assert op["security"] == [] and "401" not in op["responses"]
            else:
                assert "security" not in op and "401" in op["responses"], (method, path)


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v2/crawl/active", "GET, HEAD"),  # never taken for /v2/crawl/{id}
        ("PUT", "/v2/crawl/00000000-0000-4000-8000-000000000000", "GET, DELETE, HEAD"),
        ("TRACE", "/healthz", "GET, HEAD"),
        ("GET", "/crawl/start", "POST"),
        ("PATCH", "/consume", "POST, GET, HEAD"),
    ],
)
async def test_405_answers_carry_allow(
    start_daemon: StartDaemon, method: str, path: str, allow: str
) -> None:
    daemon = await start_daemon(extra=NO_COLLECTOR)
    async with client(daemon) as http:
        answer = await http.request(method, path)
    assert answer.status_code == 405
    assert answer.headers["allow"] == allow
    assert answer.json() == {"error": "method not allowed", "detail": {"method": method}}
