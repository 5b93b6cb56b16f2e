# OCR backends, behind one small interface so another engine (a vision model, RapidOCR) can be
# added without touching the reader. Tesseract (Debian's tesseract-ocr, Apache-2.0, models in the
# .debs, nothing downloaded) runs as one subprocess per page: a trio subprocess is cancellable
# (a timeout or a cancelled scrape kills it), needs no thread, and its address space is bounded
# with prlimit so a hostile image fails its page instead of the daemon. Its OpenMP threads are
# held to one per process: concurrency comes from [ocr] concurrency, not from each process.
# Recognised text is kept in a small in-memory LRU by the file's SHA-256 and page, so the same
# file (another URL, an upload, a crawl again) is not OCR'd twice while the daemon runs.
from __future__ import annotations

import os
import shutil
from collections import OrderedDict
from typing import Protocol

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


def backend_for(config: OcrConfig) -> OcrBackend | None:
    """The configured backend, or None when OCR is off or its engine is not installed."""
    if config.enabled is False:
        return None
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
