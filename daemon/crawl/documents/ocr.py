# OCR backends, behind one small interface: tesseract, or the [llm] provider's vision model for
# operators who prefer it (another engine, RapidOCR, would be a third class). Tesseract (Debian's
# tesseract-ocr, Apache-2.0, models in the .debs, nothing downloaded) runs as one subprocess per
# page: a trio subprocess is cancellable (a timeout or a cancelled scrape kills it), needs no
# thread, and its address space is bounded with prlimit so a hostile image fails its page instead
# of the daemon. Its OpenMP threads are held to one per process: concurrency comes from [ocr]
# concurrency, not from each process. Recognised text is kept in a small in-memory LRU by the
# file's SHA-256 and page, so the same file (another URL, an upload, a crawl again) is not OCR'd
# twice while the daemon runs.
from __future__ import annotations

import base64
import os
import shutil
import struct
import zlib
from collections import OrderedDict
from typing import Any, Protocol

import trio

from daemon.crawl.config import OcrConfig, find_ocr_engine

__all__ = ["OcrBackend", "OcrCache", "OcrFailed", "Tesseract", "backend_for"]


class OcrFailed(Exception):
    """The engine could not read the image (the message says why; no content in it)."""


class OcrBackend(Protocol):
    identity: str
    """What makes a result reusable (engine, languages, resolution): part of the cache key."""

    async def recognize(self, image: bytes) -> str:
        """The text of one image (PNG, JPEG, WebP, TIFF or PGM); OcrFailed when unreadable.
        Callers bound it with a timeout: cancelling it stops the work."""
        ...


class Tesseract:
    def __init__(self, config: OcrConfig, executable: str) -> None:
        self.languages = "+".join(config.languages)
        self.identity = f"tesseract:{self.languages}:{config.dpi}"
        command = [executable, "stdin", "stdout", "-l", self.languages, "--psm", "3"]
        prlimit = shutil.which("prlimit")
        if prlimit is not None:
            command = [prlimit, f"--as={config.max_memory}", "--", *command]
        self.command = command
        self.env = {**os.environ, "OMP_THREAD_LIMIT": "1"}

    async def recognize(self, image: bytes) -> str:
        done = await trio.run_process(
            self.command, stdin=image, capture_stdout=True, capture_stderr=True, check=False,
            env=self.env,
        )  # fmt: skip
        if done.returncode != 0:
            lines = [x for x in done.stderr.decode("utf-8", "replace").splitlines() if x.strip()]
            why = lines[-1] if lines else f"exit status {done.returncode}"
            raise OcrFailed(f"tesseract failed: {why}"[:300])
        return clean_text(done.stdout.decode("utf-8", "replace"))


def clean_text(text: str) -> str:
    """Tesseract's output as markdown paragraphs: form feeds and trailing spaces gone, at most
    one blank line between paragraphs."""
    lines = [line.rstrip() for line in text.replace("\x0c", "\n").splitlines()]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()


class LlmVision:
    """The [llm] provider's vision model: one page image per chat request, as a data URL (PDF
    pages as PNG; PNG, JPEG and WebP images as they are)."""

    def __init__(self, config: OcrConfig, llm: Any) -> None:
        self.llm = llm
        self.provider = config.llm_provider or None
        self.identity = f"llm:{config.llm_provider}:{config.dpi}"

    async def recognize(self, image: bytes) -> str:
        from daemon.llm.types import LlmError

        media = image_media(image)
        if media is None:
            raise OcrFailed("the vision model takes PNG, JPEG or WebP images")
        if media == "image/x-portable-graymap":
            image, media = await trio.to_thread.run_sync(pgm_to_png, image), "image/png"
        url = f"data:{media};base64,{base64.b64encode(image).decode('ascii')}"
        try:
            return clean_text(await self.llm.read_image(url, provider=self.provider))
        except LlmError as exc:
            raise OcrFailed(f"the vision model failed: {exc.code}: {exc.message}"[:300]) from None


def image_media(image: bytes) -> str | None:
    if image.startswith(b"P5\n"):
        return "image/x-portable-graymap"
    if image.startswith(b"\x89PNG"):
        return "image/png"
    if image.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if image[:4] == b"RIFF" and image[8:12] == b"WEBP":
        return "image/webp"
    return None


def pgm_to_png(pgm: bytes) -> bytes:
    """A grayscale PNG of the PGM render_page makes ("P5\\n<w> <h>\\n255\\n" and the rows)."""
    _, size, _, pixels = pgm.split(b"\n", 3)
    width, height = (int(x) for x in size.split())
    rows = b"".join(b"\x00" + pixels[y * width : (y + 1) * width] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 6))
            + chunk(b"IEND", b""))  # fmt: skip


def backend_for(config: OcrConfig, llm: Any = None) -> OcrBackend | None:
    """The configured backend, or None when OCR is off, its engine is not installed or (engine
    "llm") no [llm] provider is configured."""
    if config.enabled is False:
        return None
    if config.engine == "llm":
        usable = llm is not None and llm.configured(config.llm_provider or None)
        return LlmVision(config, llm) if usable else None
    executable = find_ocr_engine(config.executable)
    return Tesseract(config, executable) if executable is not None else None


class OcrCache:
    """Recognised page text by (file SHA-256, page index, backend identity), least recently
    used first out past `max_bytes` of text."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._items: OrderedDict[tuple[str, int, str], str] = OrderedDict()

    def get(self, key: tuple[str, int, str]) -> str | None:
        text = self._items.get(key)
        if text is not None:
            self._items.move_to_end(key)
        return text

    def put(self, key: tuple[str, int, str], text: str) -> None:
        cost = len(text.encode()) + 100
        if cost > self.max_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.size -= len(old.encode()) + 100
        self._items[key] = text
        self.size += cost
        while self.size > self.max_bytes:
            _, gone = self._items.popitem(last=False)
            self.size -= len(gone.encode()) + 100

    def __len__(self) -> int:
        return len(self._items)
