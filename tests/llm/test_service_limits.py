"""LlmService's operator guarantees on a mock transport under trio's autojump clock: rate limits
reserved before sending, max_concurrency, Retry-After honoured and capped, timeouts, cancellation,
the structured-output mode fallback and its memory, the API key never echoed."""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import msgspec
import pytest
import trio
import trio.testing

from daemon.config_types import dec_hook
from daemon.llm import (
    LLM_BAD_REQUEST,
    LLM_RATE_LIMITED,
    LLM_TIMEOUT,
    LLM_UNAVAILABLE,
    LlmError,
)
from daemon.llm.config import LlmConfig
from daemon.llm.service import LlmService

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]
KEY = "sk-test-secret-123456"


def completion(content: str | None = '{"title": "x"}', **message: Any) -> httpx.Response:
    body = {
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content, **message}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }  # fmt: skip
    return httpx.Response(200, json=body)


def make(handler: Handler, **overrides: Any) -> LlmService:
    raw = {"base_url": "http://llm.test/v1", "model": "m", "api_key_env": "LLM_KEY",
           "retry_backoff_max": 30, **overrides}  # fmt: skip
    cfg = msgspec.convert(raw, LlmConfig, dec_hook=dec_hook)
    return LlmService(cfg, None, transport=httpx.MockTransport(handler),
                      env=lambda name: KEY if name == "LLM_KEY" else None)  # fmt: skip


SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}}


async def test_requests_per_minute_spaces_calls(autojump_clock: trio.testing.MockClock) -> None:
    sent: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(trio.current_time())
        return completion()

    service = make(handler, requests_per_minute=6)
    for i in range(4):
        await service.extract_json(f"page {i}", schema=SCHEMA, prompt=None)
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert all(gap >= 9.99 for gap in gaps), gaps


async def test_tokens_per_minute_counts_completion_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sent: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(trio.current_time())
        body = {"choices": [{"message": {"content": '{"title": "x"}'}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 300, "completion_tokens": 700}}  # fmt: skip
        return httpx.Response(200, json=body)

    # 1000 tokens a minute (a full bucket at first); each call costs 1000 as counted, against
    # the ~90 estimated before sending: the second waits for the bucket to hold its estimate,
    # the third for the first two calls' 2000 tokens less the bucket's 1000.
    service = make(handler, tokens_per_minute=1000, max_input_tokens=400)
    for i in range(3):
        await service.extract_json(f"page {i}", schema=SCHEMA, prompt=None)
    assert sent[1] - sent[0] >= 3 and sent[2] - sent[0] >= 60, sent


async def test_max_concurrency_holds(autojump_clock: trio.testing.MockClock) -> None:
    state = {"now": 0, "max": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await trio.sleep(1)
        state["now"] -= 1
        return completion()

    service = make(handler, max_concurrency=3)
    async with trio.open_nursery() as nursery:
        for i in range(12):
            nursery.start_soon(lambda i=i: service.summarize(f"page {i}"))
    assert state["max"] == 3
    assert trio.current_time() >= 4


async def test_retry_after_is_honoured_and_capped(autojump_clock: trio.testing.MockClock) -> None:
    sent: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(trio.current_time())
        if len(sent) == 1:
            return httpx.Response(429, headers={"Retry-After": "7"}, json={"error": "slow"})
        if len(sent) == 2:
            return httpx.Response(503, headers={"Retry-After": "3600"}, json={"error": "x"})
        return completion()

    service = make(handler, retry_backoff_max=20)
    result = await service.extract_json("page", schema=SCHEMA, prompt=None)
    assert result.value == {"title": "x"}
    assert 7 <= sent[1] - sent[0] < 7.5
    assert 20 <= sent[2] - sent[1] < 20.5  # Retry-After of an hour, cut to retry_backoff_max


async def test_429_storm_ends_rate_limited(autojump_clock: trio.testing.MockClock) -> None:
    count = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal count
        count += 1
        return httpx.Response(429, json={"error": {"message": "Rate limit reached"}})

    service = make(handler, retries=4)
    with pytest.raises(LlmError) as caught:
        await service.summarize("page")
    assert caught.value.code == LLM_RATE_LIMITED and count == 5
    assert "after 5 attempts" in caught.value.message


async def test_timeout_per_attempt(autojump_clock: trio.testing.MockClock) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.sleep(1000)
        return completion()

    service = make(handler, timeout=5, retries=1, retry_backoff_max=1)
    started = trio.current_time()
    with pytest.raises(LlmError) as caught:
        await service.summarize("page")
    assert caught.value.code == LLM_TIMEOUT
    assert 10 <= trio.current_time() - started <= 12
    assert service.status()["providers"]["default"]["in_flight"] == 0


async def test_cancel_gives_the_slot_back(autojump_clock: trio.testing.MockClock) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.sleep(1000)
        return completion()

    service = make(handler, max_concurrency=1, timeout=3000)
    with trio.move_on_after(2):
        await service.summarize("page")
    assert service.providers["default"].slots.borrowed_tokens == 0


async def test_connection_errors_end_unavailable(autojump_clock: trio.testing.MockClock) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    service = make(handler, retries=2)
    with pytest.raises(LlmError) as caught:
        await service.summarize("page")
    assert caught.value.code == LLM_UNAVAILABLE


async def test_auto_falls_back_and_remembers(autojump_clock: trio.testing.MockClock) -> None:
    modes: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        mode = "tools" if "tools" in body else body.get("response_format", {}).get("type", "text")
        modes.append(mode)
        if mode == "json_schema":
            return httpx.Response(400, json={"error": {
                "message": "response_format json_schema is not supported"}})  # fmt: skip
        if mode == "tools":
            call = {
                "id": "c",
                "type": "function",
                "function": {"name": "extract", "arguments": '{"title": "from tool"}'},
            }
            return completion(None, tool_calls=[call])
        return completion()

    service = make(handler)
    first = await service.extract_json("page 1", schema=SCHEMA, prompt=None)
    second = await service.extract_json("page 2", schema=SCHEMA, prompt=None)
    assert first.value == second.value == {"title": "from tool"}
    assert modes == ["json_schema", "tools", "tools"]
    assert service.status()["providers"]["default"]["refused_modes"] == ["json_schema"]
    # a reload with the same endpoint settings keeps what the server refused
    assert service.config is not None
    service.configure(msgspec.structs.replace(service.config, cache_ttl=60))
    await service.extract_json("page 3", schema=SCHEMA, prompt=None)
    assert modes[-1] == "tools"
    service.configure(msgspec.structs.replace(service.config, model="other"))
    await service.extract_json("page 4", schema=SCHEMA, prompt=None)
    assert modes[-2:] == ["json_schema", "tools"]


async def test_json_object_mode_puts_the_schema_in_the_prompt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bodies: list[dict[str, Any]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return completion('```json\n{"title": "fenced"}\n```')

    service = make(handler, structured_output="json_object")
    result = await service.extract_json("page", schema=SCHEMA, prompt="titles")
    assert result.value == {"title": "fenced"}
    assert bodies[0]["response_format"] == {"type": "json_object"}
    assert '"title"' in bodies[0]["messages"][0]["content"]


async def test_context_overflow_is_not_a_mode_refusal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    count = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal count
        count += 1
        return httpx.Response(400, json={"error": {
            "message": "This model's maximum context length is 8192 tokens. However, you "
                       "requested 9000 tokens", "code": "context_length_exceeded"}})  # fmt: skip

    service = make(handler)
    with pytest.raises(LlmError) as caught:
        await service.extract_json("page", schema=SCHEMA, prompt=None)
    assert caught.value.code == LLM_BAD_REQUEST and count == 1
    assert "maximum context length" in caught.value.message


async def test_the_key_is_sent_but_never_echoed(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(401, json={"error": {"message": f"Incorrect API key {KEY}"}})

    service = make(handler)
    with pytest.raises(LlmError) as caught:
        await service.summarize("page")
    assert seen == [f"Bearer {KEY}"]
    assert KEY not in str(caught.value) and "***" in caught.value.message
    assert KEY not in json.dumps(service.status())


async def test_long_content_is_cut_with_a_warning(autojump_clock: trio.testing.MockClock) -> None:
    sizes: list[int] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sizes.append(len(json.loads(request.content)["messages"][-1]["content"]))
        return completion()

    service = make(handler, max_input_tokens=1000)
    result = await service.extract_json("word " * 10_000, schema=SCHEMA, prompt=None)
    assert result.warning is not None and "too long" in result.warning
    assert sizes[0] < 4000
    short = await service.extract_json("word " * 10, schema=SCHEMA, prompt=None)
    assert short.warning is None
