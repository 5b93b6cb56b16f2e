"""OCR quality and speed: crawld's path for scanned PDFs (DocumentReader: PDFium rendering, one
tesseract process per page under [ocr] limits, the text cleaned into paragraphs) against the bare
engine (tesseract run directly on the same page images), on the same pages in the same run.

Pages are generated with known text: lines of pseudo-words and numbers drawn with Pillow in
several fonts (the bundled default and, when installed, DejaVu Sans/Serif/Mono and Liberation)
and sizes (11 to 16 pt at 150 dpi), with mild noise (speckles, a slight blur) and saved as an
image-only PDF. The bare engine reads each page rendered by PDFium at the same dpi crawld uses
(the rendering is done before the clock starts: it is crawld's own cost), one process per page
with the same concurrency, OMP_THREAD_LIMIT=1 and language.

CER is the character error rate: the edit distance between the reference and the output (both
with whitespace collapsed) over the reference's length, over all pages. pages/s is wall time;
CPU s/page is the CPU time of the engine processes plus, for crawld, its own (rendering, PDF
reading, the trio loop), which other work on a shared machine tilts far less than wall time.
Memory: the largest resident set of one engine process (RUSAGE_CHILDREN) and this process's own.

Goal (issue 35): CER no worse than the bare engine's + 1 point; pages/s at least 0.9x the bare
engine's (judged on CPU time per page when the machine is busy: see the load average printed).

Usage: .venv/bin/python scripts/bench_ocr.py [--pages N] [--concurrency N] [--dpi N] [--seed N]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import resource
import shutil
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PIL import Image, ImageDraw, ImageFilter, ImageFont

from daemon.crawl.config import OcrConfig
from daemon.crawl.documents.ocr import clean_text
from daemon.crawl.documents.parsers import ParserPlan, PdfParser
from daemon.crawl.documents.pdf import render_page
from daemon.crawl.documents.reader import DocumentReader

FONT_FILES = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSerif-Regular.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
]
SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ner",
    "sta",
    "tor",
    "ven",
    "qui",
    "pra",
    "dol",
    "fen",
    "gar",
    "hub",
    "ix",
    "jo",
    "lum",
]


def fonts(px: int) -> list[ImageFont.FreeTypeFont | ImageFont.ImageFont]:
    found: list[ImageFont.FreeTypeFont | ImageFont.ImageFont] = [ImageFont.load_default(size=px)]
    found += [ImageFont.truetype(path, px) for path in FONT_FILES if os.path.exists(path)]
    return found


def page_text(rng: random.Random, lines: int) -> list[str]:
    out = []
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(5, 9)):
            if rng.random() < 0.15:
                words.append(str(rng.randint(1, 99999)))
            else:
                word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
                words.append(word.capitalize() if rng.random() < 0.2 else word)
        out.append(" ".join(words))
    return out


def draw_page(rng: random.Random, lines: list[str]) -> Image.Image:
    size = rng.choice([23, 25, 28, 31, 33])  # 11..16 pt at 150 dpi
    font = rng.choice(fonts(size))
    page = Image.new("L", (1275, 1650), 255)
    draw = ImageDraw.Draw(page)
    for i, line in enumerate(lines):
        draw.text((110, 130 + i * int(size * 1.8)), line, font=font, fill=rng.randint(0, 60))
    for _ in range(400):  # speckles
        x, y = rng.randrange(1275), rng.randrange(1650)
        draw.point((x, y), fill=rng.randint(100, 200))
    return page.filter(ImageFilter.GaussianBlur(0.6))


def make_pdf(pages: list[Image.Image]) -> bytes:
    out = io.BytesIO()
    pages[0].save(out, "PDF", resolution=150, save_all=True, append_images=pages[1:])
    return out.getvalue()


def distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def cer(references: list[str], outputs: list[str]) -> float:
    errors = total = 0
    for ref, out in zip(references, outputs, strict=True):
        ref, out = " ".join(ref.split()), " ".join(out.split())
        errors += distance(ref, out)
        total += len(ref)
    return errors / max(total, 1)


async def bare(images: list[bytes], concurrency: int, command: list[str]) -> list[str]:
    limiter = trio.CapacityLimiter(concurrency)
    results = [""] * len(images)
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}

    async def one(i: int) -> None:
        async with limiter:
            done = await trio.run_process(
                command, stdin=images[i], capture_stdout=True, capture_stderr=True, env=env
            )
            results[i] = done.stdout.decode("utf-8", "replace")

    async with trio.open_nursery() as nursery:
        for i in range(len(images)):
            nursery.start_soon(one, i)
    return results


async def crawld(pdf: bytes, config: OcrConfig) -> list[str]:
    reader = DocumentReader(config, trio.CapacityLimiter(config.concurrency))
    parsed = await reader.parse(pdf, "pdf", ParserPlan(PdfParser(mode="ocr", pages=True)),
                                retain=False)  # fmt: skip
    return [p["markdown"] for p in parsed.pages or []]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--dpi", type=int, default=300)
    parser.add_argument("--seed", type=int, default=35)
    args = parser.parse_args()
    engine = shutil.which("tesseract")
    if engine is None:
        sys.exit("tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng)")
    rng = random.Random(args.seed)
    texts = [page_text(rng, rng.randint(8, 16)) for _ in range(args.pages)]
    pdf = make_pdf([draw_page(rng, lines) for lines in texts])
    references = ["\n".join(lines) for lines in texts]
    config = OcrConfig(dpi=args.dpi, concurrency=args.concurrency, cache_bytes=0)
    images = [render_page(pdf, i, config.dpi, config.max_pixels) for i in range(args.pages)]
    command = [engine, "stdin", "stdout", "-l", "eng", "--psm", "3"]

    results: dict[str, tuple[list[str], float, float]] = {}
    for name in ("bare", "crawld", "bare ", "crawld "):  # each twice, alternating
        started, cpu = time.perf_counter(), cpu_seconds()
        if name.strip() == "bare":
            outputs = [clean_text(t) for t in trio.run(bare, images, args.concurrency, command)]
        else:
            outputs = trio.run(crawld, pdf, config)
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
        best = results.get(name.strip())
        if best is None or seconds < best[1]:
            results[name.strip()] = (outputs, seconds, cpu)
    print(f"{args.pages} pages, {len(pdf) / 1e6:.1f} MB PDF, dpi {args.dpi}, "
          f"concurrency {args.concurrency} (best of two runs each); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'':8} {'CER %':>7} {'pages/s':>8} {'CPU s/page':>11}")
    rates = {}
    for name, (outputs, seconds, cpu) in results.items():
        rates[name] = (cer(references, outputs) * 100, args.pages / seconds, cpu / args.pages)
        print(f"{name:8} {rates[name][0]:7.2f} {rates[name][1]:8.2f} {rates[name][2]:11.2f}")
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"largest engine process {child:.0f} MiB; this process {own:.0f} MiB")
    ok_cer = rates["crawld"][0] <= rates["bare"][0] + 1
    ok_rate = rates["crawld"][1] >= 0.9 * rates["bare"][1]
    ok_cpu = rates["crawld"][2] <= rates["bare"][2] / 0.9
    print(f"goal CER <= bare + 1: {'met' if ok_cer else 'MISSED'}; "
          f"pages/s >= 0.9x bare: {'met' if ok_rate else 'MISSED'} (wall), "
          f"{'met' if ok_cpu else 'MISSED'} (CPU time)")  # fmt: skip


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    main()
