"""Screenshots of Chinese and Japanese text show the characters, not boxes (tofu): the browser's
install path brings CJK fonts (fonts-noto-cjk). Each character is drawn alone, 240 px high, on a
page of its own: with no font that has it, every one is the same missing-glyph box, so the
screenshots are identical; with one, each differs from the others."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from daemon.crawl.rendering.render import decode_data_uri
from daemon.fakes.site import SiteSim
from tests.crawlapi.test_sdk_render import crawl_config  # noqa: F401

pytestmark = pytest.mark.browser

GLYPHS = {"6c38": "永 (zh)", "8a9e": "語 (zh/ja)", "3042": "あ (ja hiragana)", "ac00": "가 (ko)"}


async def test_cjk_characters_are_drawn_not_tofu(client: httpx.AsyncClient, site: SiteSim) -> None:
    digests: dict[str, str] = {}
    for code in [*GLYPHS, "41"]:  # "A" proves the page draws text at all
        response = await client.post("/v2/scrape", json={
            "url": site.url(f"/js/glyph/{code}"),
            "formats": [{"type": "screenshot", "viewport": {"width": 320, "height": 300}}],
        })  # fmt: skip
        assert response.status_code == 200, response.text
        png = decode_data_uri(response.json()["data"]["screenshot"])
        assert png[:4] == b"\x89PNG"
        digests[code] = hashlib.sha256(png).hexdigest()
    same = [GLYPHS[c] for c in GLYPHS if list(digests.values()).count(digests[c]) > 1]
    assert not same, (
        f"{', '.join(same)} render as the same box: no CJK font is installed "
        "(apt-get install fonts-noto-cjk; scripts/install --browser does it)"
    )
