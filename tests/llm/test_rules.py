"""The LLM service's pure rules, as tables of values."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.config import ConfigError
from daemon.llm import rules
from daemon.net.ratelimit import gcra
from daemon.settings import decode


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "object", "properties": {"a": {}}, "additionalProperties": False,
          "required": ["a", "b"]}, {"type": "object", "properties": {"a": {}}, "required": ["a"]}),
        ({"type": "object", "properties": {"a": {}}, "required": ["z"]},
         {"type": "object", "properties": {"a": {}}}),
        ({"$ref": "#/$defs/x", "additionalProperties": True},
         {"$ref": "#/$defs/x", "additionalProperties": True}),
    ],
)  # fmt: skip
def test_normalize_schema(schema: dict[str, Any], expected: dict[str, Any]) -> None:
    assert rules.normalize_schema(schema) == expected


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "object", "properties": {"a": {"type": "string"}}}, None),
        ({"type": "array", "items": {"type": "string"}}, None),
        ({"type": "object", "additionalProperties": True}, "schema-less dictionary"),
        ({"type": "object", "properties": {"m": {"type": "object",
                                                 "additionalProperties": True}}},
         "schema-less dictionary"),
        ({"type": "nope"}, "Invalid JSON schema"),
        ({"properties": {"a": {"minLength": "x"}}}, "Invalid JSON schema"),
        ("text", "JSON Schema object"),
    ],
)  # fmt: skip
def test_schema_problem(schema: Any, problem: str | None) -> None:
    found = rules.schema_problem(schema)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_strict_schema_requires_everything_and_wraps_arrays() -> None:
    strict, wrapped = rules.strict_schema({
        "type": "object", "properties": {"a": {"type": "string", "minLength": 3},
                                         "b": {"type": "object", "properties": {"c": {}}}},
        "required": ["a"]})  # fmt: skip
    assert not wrapped and strict["required"] == ["a", "b"]
    assert strict["additionalProperties"] is False
    assert strict["properties"]["a"] == {"type": "string"}
    assert strict["properties"]["b"]["required"] == ["c"]
    array, wrapped = rules.strict_schema({"type": "array", "items": {"type": "string"}})
    assert wrapped and array["properties"]["items"] == {
        "type": "array",
        "items": {"type": "string"},
    }


@pytest.mark.parametrize(
    ("value", "schema", "problem"),
    [
        ({"a": "x"}, {"type": "object", "properties": {"a": {"type": "string"}}}, None),
        ({"a": 1}, {"type": "object", "properties": {"a": {"type": "string"}}}, "$.a"),
        ([{"a": 1}], {"type": "array", "items": {"type": "object",
                                                   "properties": {"a": {"type": "string"}}}},
         "$[0].a"),
        ("text", None, "not a JSON object"),
        ({"any": 1}, None, None),
    ],
)  # fmt: skip
def test_validation_problem(value: Any, schema: Any, problem: str | None) -> None:
    found = rules.validation_problem(value, schema)
    assert (found is None) if problem is None else (found is not None and problem in found)


@pytest.mark.parametrize(
    ("text", "value", "ok"),
    [
        ('{"a": 1}', {"a": 1}, True),
        ('```json\n{"a": 1}\n```', {"a": 1}, True),
        ("```\n[1, 2]\n```", [1, 2], True),
        ("Sure! {a: 1}", None, False),
    ],
)
def test_parse_json(text: str, value: Any, ok: bool) -> None:
    parsed, problem = rules.parse_json(text)
    assert (problem is None) is ok and parsed == value


@pytest.mark.parametrize(
    ("status", "message", "mode", "refused"),
    [
        (400, "response_format json_schema is not supported", "json_schema", True),
        (400, "'response_format.type' must be 'json_schema' or 'text'", "json_object", True),
        (400, "This model's maximum context length is 8192 tokens", "json_schema", False),
        (400, "the request exceeds the available context size", "tools", False),
        (500, "tool_choice is not supported", "tools", True),
        (500, "internal error", "tools", False),
        (401, "invalid api key", "json_schema", False),
        (400, "bad", "text", False),
    ],
)
def test_refuses_mode(status: int, message: str, mode: str, refused: bool) -> None:
    assert rules.refuses_mode(status, message, mode) is refused


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after": "Thu, 01 Jan 1970 00:01:40 GMT"}, 40.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after(headers: dict[str, str], seconds: float | None) -> None:
    assert rules.retry_after(headers, now=60.0) == seconds


@pytest.mark.parametrize(
    ("attempt", "asked", "cap", "wait"),
    [(1, None, 30, 0.5), (3, None, 30, 2.0), (10, None, 30, 30.0), (1, 7.0, 30, 7.0),
     (1, 3600.0, 20, 20.0)],
)  # fmt: skip
def test_backoff(attempt: int, asked: float | None, cap: float, wait: float) -> None:
    assert rules.backoff(attempt, asked, cap) == wait


def test_cache_key_depends_on_each_part() -> None:
    base = ("json", "m", "p", {"type": "object"}, "content")
    key = rules.cache_key(*base)
    assert key == rules.cache_key(*base)
    for i, other in enumerate(("summary", "m2", "q", {"type": "array"}, "content2")):
        changed = list(base)
        changed[i] = other
        assert rules.cache_key(*changed) != key  # type: ignore[arg-type]


def test_fit_content() -> None:
    assert rules.fit_content("abc", 10) == ("abc", None)
    cut, warning = rules.fit_content("x" * 100, 10)
    assert cut == "x" * 40 and warning is not None and "40 characters" in warning


def test_usage_of_tolerates_missing_fields() -> None:
    assert rules.usage_of({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}) == (3, 4)
    assert rules.usage_of({"usage": None}) == (0, 0)
    assert rules.usage_of({"usage": {"prompt_tokens": -1}}) == (0, 0)


def test_gcra_with_a_cost() -> None:
    first = gcra(float("-inf"), 0.0, rate=10.0, burst=100, cost=100)
    assert first.wait == 0.0 and first.tat == pytest.approx(10.0)
    second = gcra(first.tat, 0.0, rate=10.0, burst=100, cost=20)
    assert second.wait == pytest.approx(2.0)
    too_big = gcra(float("-inf"), 0.0, rate=10.0, burst=5, cost=50)
    assert too_big.wait == 0.0  # capped at the burst: it goes, and later ones pay for it
    assert gcra(0.0, 0.0, rate=1.0, burst=1) == gcra(0.0, 0.0, rate=1.0, burst=1, cost=1)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('[llm]\nmodel = "m"', "base_url"),
        ('[llm]\nbase_url = "ftp://x/v1"\nmodel = "m"', "$.llm"),
        ('[llm]\nbase_url = "http://u:p@x/v1"\nmodel = "m"', "$.llm"),
        ('[llm]\nbase_url = "http://x/v1"\nmodel = "m"\nmax_concurrency = 0', "$.llm"),
        ('[llm]\nbase_url = "http://x/v1"\nmodel = "m"\nstructured_output = "xml"',
         "$.llm.structured_output"),
        ('[llm]\nbase_url = "http://x/v1"\nmodel = "m"\n[llm.providers.b]\nmodel = "m"',
         "$.llm.providers"),
        ('[llm]\nbase_url = "http://x/v1"\nmodel = "m"\ntokens_per_minute = 10', "$.llm"),
        ('[llm]\nbase_url = "http://x/v1"\nmodel = "m"\ncolour = 1', "colour"),
    ],
)  # fmt: skip
def test_llm_config_errors_name_the_key(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        decode(text, "c.toml")
    assert where in str(caught.value) and "c.toml" in str(caught.value)


def test_llm_config_providers() -> None:
    cfg = decode('[llm]\nbase_url = "http://127.0.0.1:11434/v1"\nmodel = "qwen"\n'
                 '[llm.providers.openai]\nbase_url = "https://api.openai.com/v1"\n'
                 'model = "gpt-4o-mini"\napi_key_env = "OPENAI_API_KEY"\n', "c.toml")  # fmt: skip
    assert cfg.llm is not None and cfg.llm.provider_names() == ["default", "openai"]
    openai = cfg.llm.provider("openai")
    assert openai is not None and openai.chat_url == "https://api.openai.com/v1/chat/completions"
    assert decode("", "c.toml").llm is None
