"""LlmService against the OpenAI-compatible simulator over real sockets, with a real store."""

from __future__ import annotations

import pytest

from daemon.llm import LLM_BAD_OUTPUT, LLM_NOT_CONFIGURED, LlmError
from daemon.llm.service import LlmService
from daemon.store import Store
from tests.llm.conftest import Sim

PAGE = "# Acme Widget\n\nprice: 42 EUR\nvendor: Acme Corp\n\n- red\n- blue\n"
SCHEMA = {
    "type": "object",
    "properties": {
        "vendor": {"type": "string"},
        "price": {"type": "number"},
        "colors": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["vendor"],
}


async def test_extract_json_reaches_the_model_and_is_cached(sim: Sim, store: Store) -> None:
    service = LlmService(sim.config(), store)
    try:
        result = await service.extract_json(PAGE, schema=SCHEMA, prompt="the product")
        assert result.value == {"vendor": "Acme Corp", "price": 42, "colors": ["red", "blue"]}
        assert not result.cached and result.usage.prompt_tokens > 0
        assert result.provider == "default" and result.model == "sim-model"
        sent = sim.service.requests[-1]
        assert sent["response_format"]["type"] == "json_schema"
        assert "price: 42 EUR" in sent["messages"][-1]["content"]
        assert "Instructions: the product" in sent["messages"][-1]["content"]
        again = await service.extract_json(PAGE, schema=SCHEMA, prompt="the product")
        assert again.cached and again.value == result.value and again.usage.total_tokens == 0
        assert len(sim.service.requests) == 1
        other = await service.extract_json(PAGE, schema=SCHEMA, prompt="another question")
        assert not other.cached and len(sim.service.requests) == 2
    finally:
        await service.aclose()


async def test_summary(sim: Sim) -> None:
    service = LlmService(sim.config(), None)
    try:
        result = await service.summarize(PAGE)
        assert result.value == "Summary of Acme Widget: 13 words."
        assert "response_format" not in sim.service.requests[-1]
    finally:
        await service.aclose()


async def test_not_configured() -> None:
    service = LlmService(None, None)
    assert not service.configured()
    with pytest.raises(LlmError) as caught:
        await service.summarize("x")
    assert caught.value.code == LLM_NOT_CONFIGURED


async def test_invalid_json_repaired_once_then_error(sim: Sim) -> None:
    service = LlmService(sim.config(), None)
    try:
        sim.service.invalid_json(1)
        result = await service.extract_json(PAGE, schema=SCHEMA, prompt=None)
        assert result.value["vendor"] == "Acme Corp"
        assert len(sim.service.requests) == 2
        assert "not usable" in sim.service.requests[-1]["messages"][-1]["content"]
        sim.service.invalid_json(2)
        with pytest.raises(LlmError) as caught:
            await service.extract_json(PAGE + "x", schema=SCHEMA, prompt=None)
        assert caught.value.code == LLM_BAD_OUTPUT
        assert len(sim.service.requests) == 4
    finally:
        await service.aclose()
