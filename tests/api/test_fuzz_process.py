"""HTTP fuzzing of a crawld subprocess (issue 7): every route in /openapi.json gets random
methods, paths, query strings, bodies, content types, sizes and headers, with and without the key.
Every answer must be JSON (only /metrics answers text), 2xx or 4xx, and 503/507 only where the
route documents them; never 500. Then large bodies (streamed past max_body, and huge declared
lengths) must leave the daemon's peak memory where it was.

Hypothesis is derandomized, so a run is repeatable; the daemon's config turns off the areas that
would fetch URLs taken from a request body (no packet may leave the machine in a test)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.conftest import crawld_subprocess

pytestmark = pytest.mark.process

KEY = "fuzz-key-0123456789abcdef"
MAX_BODY = 64 * 1024
CONFIG = f"""
[daemon]
state_dir = "state"
[http]
bind = "127.0.0.1:0"
api_key_env = "CRAWLD_FUZZ_KEY"
max_body = {MAX_BODY}
body_timeout = "5s"
[collector]
auto_start = false
[crawl]
enabled = false
"""
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
EDGE_STATUSES = {400, 401, 403, 404, 405, 408, 413, 415, 421, 422, 431}
"""Answers any route may give before a handler runs (bad input, refusals)."""


class Crawld:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def memory_kb(self, field: str) -> int:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
        assert match, text
        return int(match.group(1))


@pytest.fixture(scope="module")
def crawld(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crawld]:
    tmp = tmp_path_factory.mktemp("fuzz")
    with crawld_subprocess(tmp, CONFIG, env={"CRAWLD_FUZZ_KEY": KEY}) as (proc, port):
        yield Crawld(proc, port)
    log = (tmp / "stderr.log").read_text(errors="replace")
    assert "internal error" not in log, log[-5000:]


@pytest.fixture(scope="module")
def spec(crawld: Crawld) -> dict[str, Any]:
    answer = httpx.get(
        crawld.base + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    )
    assert answer.status_code == 200
    document: dict[str, Any] = answer.json()
    return document


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
field_names = st.sampled_from(
    ["task_id", "webhook", "count", "url", "headers", "metadata", "events", "limit", "x"]
)
bodies = st.one_of(
    st.none(),
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(field_names, json_values, max_size=4).map(lambda v: json.dumps(v).encode()),
    st.sampled_from([MAX_BODY - 10, MAX_BODY + 1, 4 * MAX_BODY]).map(
        lambda n: b"[" + b"1," * (n // 2)
    ),
    st.integers(1, 3000).map(lambda depth: b"[" * depth + b"]" * depth),
)
content_types = st.sampled_from(
    [None, "application/json", "application/json; charset=utf-8", "text/plain",
     "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
     "application/problem+json", "", "\x7f/\x01"]
)  # fmt: skip
texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)


@st.composite
def requests(draw: st.DrawFn, spec: dict[str, Any]) -> dict[str, Any]:
    paths = sorted(spec["paths"])
    path = draw(st.sampled_from(paths))
    documented = sorted(spec["paths"][path])
    method = draw(st.sampled_from([m.upper() for m in documented]) | st.sampled_from(METHODS))
    concrete = path
    if "{" in path:
        part = draw(st.one_of(st.just(str(uuid.uuid4())), texts.filter(bool)))
        concrete = re.sub(r"\{[^}]+\}", quote(part, safe=""), path)
    names = [p["name"] for p in spec["paths"][path].get(method.lower(), {}).get("parameters", [])]
    query = draw(
        st.dictionaries(st.sampled_from([*names, "count", "skip", "zz"]), texts, max_size=3)
    )
    headers: dict[str, str] = {}
    auth = draw(st.sampled_from(["key", "none", "wrong", "basic"]))
    if auth == "key":
        headers["Authorization"] = f"Bearer {KEY}"
    elif auth == "wrong":
        headers["Authorization"] = "Bearer " + draw(st.text("abc", min_size=1, max_size=30))
    elif auth == "basic":
        headers["Authorization"] = "Basic dXNlcjpwdw=="
    content_type = draw(content_types)
    if content_type is not None:
        headers["Content-Type"] = content_type
    for name, values in (
        ("Origin", ["null", "https://evil.example", "http://127.0.0.1:1"]),
        ("Sec-Fetch-Site", ["cross-site", "same-site", "same-origin", "none"]),
        ("Host", ["evil.example", "localhost", "127.0.0.1"]),
        ("X-Forwarded-For", ["1.2.3.4"]),
    ):
        if draw(st.booleans()) and draw(st.booleans()):
            headers[name] = draw(st.sampled_from(values))
    return {
        "method": method,
        "path": path,
        "url": concrete,
        "params": query,
        "headers": headers,
        "content": draw(bodies),
        "chunked": draw(st.booleans()),
    }


def check_answer(spec: dict[str, Any], request: dict[str, Any], answer: httpx.Response) -> None:
    status = answer.status_code
    where = f"{request['method']} {request['url']} -> {status}: {answer.text[:300]}"
    assert status != 500 and status < 600, where
    documented = {
        int(code)
        for op in spec["paths"][request["path"]].values()
        for code in op["responses"]
        if code.isdigit()
    }
    if status >= 500:
        assert status in documented, where
    else:
        assert 200 <= status < 300 or status in EDGE_STATUSES | documented, where
    if request["method"] == "HEAD":
        return
    if request["path"] == "/metrics" and status == 200:
        assert answer.headers["content-type"].startswith("text/plain"), where
        return
    assert answer.headers["content-type"] == "application/json", where
    json.loads(answer.content)


def send(client: httpx.Client, request: dict[str, Any]) -> httpx.Response:
    content = request["content"]
    if content is not None and request["chunked"]:
        body = content
        content = iter([body[i : i + 8192] for i in range(0, len(body), 8192)] or [b""])
    return client.request(
        request["method"],
        request["url"],
        params=request["params"],
        headers=request["headers"],
        content=content,
    )


def test_fuzz_every_route(crawld: Crawld, spec: dict[str, Any]) -> None:
    assert len(spec["paths"]) >= 10
    with httpx.Client(base_url=crawld.base, timeout=30, trust_env=False) as client:

        @settings(
            max_examples=1500,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(request=requests(spec))
        def fuzz(request: dict[str, Any]) -> None:
            check_answer(spec, request, send(client, request))

        fuzz()
        assert client.get("/healthz").json() == {"status": "ok"}


def test_large_bodies_leave_memory_bounded(crawld: Crawld) -> None:
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    with httpx.Client(base_url=crawld.base, timeout=30, trust_env=False) as client:
        client.post("/crawl/stop", headers=auth, content=b"{}")
        before = crawld.memory_kb("VmHWM")
        chunk = b" " * (1024 * 1024)
        for _ in range(8):  # 8 bodies of 64 MiB each, streamed without a length
            answer = client.post("/crawl/stop", headers=auth, content=iter([chunk] * 64))
            assert answer.status_code == 413
        for _ in range(200):  # bodies just under the limit, echoing nothing back at length
            answer = client.post(
                "/crawl/stop",
                headers=auth,
                content=b'{"task_id": "' + b"x" * (MAX_BODY - 32) + b'"}',
            )
            assert answer.status_code == 404 and len(answer.content) < 1000
    for _ in range(50):  # claims of 500 MiB: refused before a byte of body is read
        with socket.create_connection(("127.0.0.1", crawld.port), timeout=30) as sock:
            sock.sendall(
                b"POST /crawl/stop HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                b"Content-Type: application/json\r\nContent-Length: 524288000\r\n\r\n{"
            )
            assert sock.recv(100).startswith(b"HTTP/1.1 413")
    grown_mib = (crawld.memory_kb("VmHWM") - before) / 1024
    print(f"peak RSS grew by {grown_mib:.1f} MiB")
    assert grown_mib < 32
