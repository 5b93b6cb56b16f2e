"""The OCR path's bounds and faults: a page past [ocr] page_timeout has its engine process killed
and is named in the warning, a document past document_timeout is SCRAPE_TIMEOUT, an engine that
crashes on one page leaves the others' text; the cache holds by SHA-256 and forgets past its
size; [ocr] config errors name the key. Engines here are small shell scripts standing in for
tesseract (same argv and stdin/stdout contract)."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest
import trio

from daemon.crawl.config import OcrConfig
from daemon.crawl.documents.errors import DocumentError
from daemon.crawl.documents.ocr import OcrCache, clean_text
from daemon.crawl.documents.parsers import ParserPlan, PdfParser
from daemon.crawl.documents.pdf import render_page
from daemon.crawl.documents.reader import DocumentReader
from daemon.settings import ConfigError, decode
from tests.crawl import documents as docs

SCAN3 = docs.scanned_pdf([["one"], ["two"], ["three"]])
OCR_ALL = ParserPlan(PdfParser(mode="ocr", pages=True))


def engine_script(tmp_path: Path, body: str) -> str:
    """An executable standing in for tesseract; `$COUNT` is this call's number (1, 2, ...)."""
    path = tmp_path / "fake-tesseract"
    path.write_text(
        "#!/bin/sh\n"
        f'n=$(cat "{tmp_path}/count" 2>/dev/null || echo 0); n=$((n + 1)); '
        f'echo $n > "{tmp_path}/count"; COUNT=$n\n'
        f'cat > /dev/null\n{body}\n'
    )  # fmt: skip
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def reader(executable: str, **overrides: object) -> DocumentReader:
    fields: dict[str, object] = {"executable": executable, "concurrency": 1}
    fields.update(overrides)
    return DocumentReader(OcrConfig(**fields))  # type: ignore[arg-type]


async def test_an_engine_crash_on_one_page_keeps_the_others(tmp_path: Path) -> None:
    script = engine_script(
        tmp_path, 'if [ "$COUNT" = 2 ]; then echo "Segmentation fault" >&2; kill -9 $$; fi\n'
        'echo "text of call $COUNT"',
    )  # fmt: skip
    parsed = await reader(script).parse(SCAN3, "pdf", OCR_ALL, retain=True)
    pages = [p["markdown"] for p in parsed.pages or []]
    crashed = pages.index("")  # the second call, whichever page it read
    assert sorted(pages) == ["", "text of call 1", "text of call 3"]
    assert parsed.warnings == [
        f"OCR failed on page {crashed + 1}: tesseract failed: Segmentation fault."
    ]
    assert parsed.markdown == "\n\n".join(p for p in pages if p)


async def test_every_page_failing_is_an_error_not_an_empty_document(tmp_path: Path) -> None:
    script = engine_script(tmp_path, 'echo "Error opening data file eng.traineddata" >&2; exit 1')
    with pytest.raises(DocumentError) as info:
        await reader(script).parse(SCAN3, "pdf", OCR_ALL, retain=True)
    assert info.value.code == "SCRAPE_UNSUPPORTED_FILE_ERROR"
    assert "eng.traineddata" in info.value.message


async def test_a_slow_page_is_killed_at_page_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Jump only after 3 s of real idleness: never while a page renders in its thread or a quick
    # engine process starts on a loaded machine, so only the sleeping page reaches its deadline.
    autojump_clock.autojump_threshold = 3
    pid_file = tmp_path / "pid"
    script = engine_script(
        tmp_path, f'if [ "$COUNT" = 1 ]; then echo $$ > "{pid_file}"; exec sleep 600; fi\n'
        'echo "page $COUNT"',
    )  # fmt: skip
    parsed = await reader(script, page_timeout=5).parse(SCAN3, "pdf", OCR_ALL, retain=True)
    pages = [p["markdown"] for p in parsed.pages or []]
    slow = pages.index("")
    assert sorted(pages) == ["", "page 2", "page 3"]
    assert f"page {slow + 1}: longer than 5s" in parsed.warnings[0]
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(pid, 0)


async def test_a_slow_document_is_a_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    autojump_clock.autojump_threshold = 0.5
    script = engine_script(tmp_path, "exec sleep 600")
    slow = reader(script, page_timeout=50, document_timeout=20)
    with pytest.raises(DocumentError) as info:
        await slow.parse(SCAN3, "pdf", OCR_ALL, retain=True)
    assert info.value.code == "SCRAPE_TIMEOUT" and info.value.status == 408
    assert "document_timeout" in info.value.message


async def test_results_are_cached_by_file_hash_unless_retention_is_off(tmp_path: Path) -> None:
    script = engine_script(tmp_path, 'echo "call $COUNT"')
    made = reader(script)
    one_page = ParserPlan(PdfParser(mode="ocr", max_pages=1))
    first = await made.parse(SCAN3, "pdf", one_page, retain=True)
    again = await made.parse(SCAN3, "pdf", one_page, retain=True)
    assert first.markdown == again.markdown == "call 1" and made.pages_ocrd == 1
    private = await made.parse(SCAN3, "pdf", one_page, retain=False)
    assert private.markdown == "call 2" and len(made.cache) == 1
    other = docs.scanned_pdf([["one"], ["different"]])
    assert (await made.parse(other, "pdf", one_page, retain=True)).markdown == "call 3"


def test_the_cache_forgets_the_oldest_past_its_size() -> None:
    cache = OcrCache(max_bytes=350)
    for i in range(4):
        cache.put(("sha", i, "t"), "x" * 50)
    assert len(cache) == 2 and cache.get(("sha", 0, "t")) is None
    assert cache.get(("sha", 3, "t")) == "x" * 50
    cache.put(("sha", 9, "t"), "y" * 1000)  # bigger than the whole cache: not kept
    assert cache.get(("sha", 9, "t")) is None and cache.size <= 350


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Hello\n\n\n\nworld\x0c", "Hello\n\nworld"),
        ("  \nline one  \nline two\n\x0c", "line one\nline two"),
        ("", ""),
    ],
)
def test_engine_output_becomes_paragraphs(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('[ocr]\nenabled = "maybe"', "$.ocr.enabled"),
        ("[ocr]\ndpi = 20", "dpi must be between 72 and 600"),
        ('[ocr]\nlanguages = ["eng;rm"]', "not a tesseract language"),
        ('[ocr]\nenabled = true\nexecutable = "/nonexistent/tesseract"', "at `$.ocr.enabled`"),
        ("[parse]\nmax_bytes = 10", "max_bytes must be at least 1024"),
    ],
)
def test_config_errors_name_the_key(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        decode(text)
    assert where in str(info.value)


@pytest.mark.parametrize(
    ("fmt", "options"),
    [("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}), ("WEBP", {}),
     ("WEBP", {"lossless": True})],
)  # fmt: skip
def test_image_size_is_read_from_the_header(fmt: str, options: dict[str, object]) -> None:
    import io

    from PIL import Image

    from daemon.crawl.documents.sniff import image_size

    out = io.BytesIO()
    Image.new("L", (1234, 567), 255).save(out, fmt, **options)
    assert image_size(out.getvalue()) == (1234, 567)
    assert image_size(out.getvalue()[:10]) is None


async def test_an_image_over_max_pixels_is_refused_before_ocr(tmp_path: Path) -> None:
    import io

    from PIL import Image

    script = engine_script(tmp_path, 'echo "never"')
    out = io.BytesIO()
    Image.new("L", (1500, 1000), 255).save(out, "PNG")
    with pytest.raises(DocumentError) as info:
        await reader(script, max_pixels=1_000_000).parse(
            out.getvalue(), "png", ParserPlan(), retain=True
        )
    assert info.value.status == 413 and "1500x1000 pixels" in info.value.message
    assert not (tmp_path / "count").exists()  # the engine never ran


async def test_the_llm_vision_backend_reads_pages_as_png(nursery: trio.Nursery) -> None:
    import base64
    import functools

    import msgspec

    from daemon.config_types import dec_hook
    from daemon.fakes.openai_compat import OpenAICompatService, serve_openai_compat
    from daemon.llm.config import LlmConfig
    from daemon.llm.service import LlmService

    sim = OpenAICompatService()
    shutdown = trio.Event()
    host, port = await nursery.start(
        functools.partial(serve_openai_compat, sim, "127.0.0.1:0", shutdown=shutdown)
    )
    raw = {"base_url": f"http://{host}:{port}/v1", "model": "vision-sim", "retries": 0}
    llm = LlmService(msgspec.convert(raw, LlmConfig, dec_hook=dec_hook))
    made = DocumentReader(OcrConfig(engine="llm", dpi=72), llm=llm)
    assert made.ocr and made.status()["engine"] == "llm"
    sim.reply("Page one, read by the model", times=1)
    parsed = await made.parse(SCAN3, "pdf", ParserPlan(PdfParser(max_pages=1)), retain=True)
    assert parsed.markdown == "Page one, read by the model"
    content = sim.requests[-1]["messages"][1]["content"]
    url = content[1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    png = base64.b64decode(url.split(",", 1)[1])
    from PIL import Image

    decoded = Image.open(io.BytesIO(png))
    assert decoded.size == (612, 792) and decoded.mode == "L"  # a letter page at 72 dpi
    pgm = render_page(SCAN3, 0, 72, 40_000_000)
    assert decoded.tobytes() == pgm.split(b"\n", 3)[3]
    sim.fail(times=1, status=400)
    with pytest.raises(DocumentError) as info:
        await made.parse(docs.scanned_pdf([["x"]]), "pdf", OCR_ALL, retain=True)
    assert "the vision model failed" in info.value.message
    assert not DocumentReader(OcrConfig(engine="llm"), llm=LlmService(None)).ocr
    await llm.aclose()
    shutdown.set()
