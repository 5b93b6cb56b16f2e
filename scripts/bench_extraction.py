"""Main-content extraction quality: crawld's `onlyMainContent` markdown next to trafilatura and
readability-lxml, on the same pages in the same run.

Data set: trafilatura's evaluation corpus (about 990 real web pages, news, blogs, institutional
pages, docs; each with up to 6 "with" snippets that the main content holds and up to 6 "without"
snippets of boilerplate it must not hold), pinned to one commit of the public repository
github.com/adbar/trafilatura (files tests/evaldata.json, tests/eval/, tests/cache/). It is not
shipped with crawld: fetch it once and pass its `tests` folder with --data, or put it at
~/.cache/crawld/extraction-eval/tests (the default):

    git clone https://github.com/adbar/trafilatura && cd trafilatura
    git checkout e90b0ef51ab026fdb905fb6c5b3c84dd3d784fd5
    mkdir -p ~/.cache/crawld/extraction-eval && cp -r tests ~/.cache/crawld/extraction-eval/

The script checks the SHA-256 of evaldata.json and of every page it reads against the pinned
values and refuses a different corpus.

Scoring is the corpus's own (its tests/eval_common.py): per page, a "with" snippet found in the
output (whitespace-normalised substring) is a true positive, a missing one a false negative, a
"without" snippet found is a false positive; precision, recall and F1 over all snippets. crawld's
markdown is reduced to text first (link targets, image references, emphasis and table pipes
removed, escapes undone).

Each system runs in its own process (all three started first); trafilatura (its evaluation's
"fallback" settings: comments excluded, tables included) and readability-lxml import nothing from
`daemon`. Each page goes to the three in turn (which one goes first rotating from page to page),
so they are timed at nearly the same moment.
ms/page is the mean CPU time of the extraction call alone (the page bytes in, the text out;
crawld's includes decoding, metadata, main content and markdown), one page at a time: CPU time,
not wall time, so that other work on the machine tilts the comparison as little as it can.

Usage: .venv/bin/python scripts/bench_extraction.py [--data DIR] [--limit N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path.home() / ".cache" / "crawld" / "extraction-eval" / "tests"
SOURCE = "github.com/adbar/trafilatura@e90b0ef51ab026fdb905fb6c5b3c84dd3d784fd5 (tests/)"
EVALDATA_SHA256 = "6179b235b77918840552e9b166adcfc411e56a3342fc4873cc0d35944cc30b52"
PAGES_SHA256 = "20f596d2eccbef43c604feca2bcb94ab75ce589e6ab7d44de27909cae4332174"
SYSTEMS = ("crawld", "trafilatura", "readability")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def load_corpus(data: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """(url, html path, annotation) of every page, after checking the pinned hashes."""
    evaldata_path = data / "evaldata.json"
    if not evaldata_path.is_file():
        sys.exit(f"no evaldata.json under {data}: see the docstring for how to get the corpus")
    raw = evaldata_path.read_bytes()
    if hashlib.sha256(raw).hexdigest() != EVALDATA_SHA256:
        sys.exit(f"{evaldata_path} is not the pinned corpus ({SOURCE})")
    evaldata = json.loads(raw)
    pages = []
    manifest = hashlib.sha256()
    for url in sorted(evaldata):
        item = evaldata[url]
        for sub in ("cache", "eval"):
            path = data / sub / item["file"]
            if path.is_file():
                break
        else:
            sys.exit(f"{url}: page file {item['file']} missing under {data}")
        manifest.update(f"{sub}/{item['file']}\0".encode())
        manifest.update(hashlib.sha256(path.read_bytes()).digest())
        pages.append((url, path, item))
    if manifest.hexdigest() != PAGES_SHA256:
        sys.exit(f"the page files under {data} are not the pinned corpus ({SOURCE})")
    return pages


# --- workers: each runs in its own process ------------------------------------------------------


def _crawld_runner() -> Any:
    sys.path.insert(0, str(ROOT))
    from daemon.crawl.content.document import DocumentOptions, build_document
    from daemon.crawl.fetching.fetch import FetchResult

    options = DocumentOptions(formats=frozenset({"markdown"}), only_main_content=True)

    def run(url: str, body: bytes) -> str:
        result = FetchResult(url, url, 200, "text/html", {}, body)
        document = build_document(result, options, source_url=url, scrape_id="bench")
        return str(document["markdown"])

    return run


def _trafilatura_runner() -> Any:
    from trafilatura import extract

    def run(url: str, body: bytes) -> str:
        return (
            extract(
                body,
                fast=False,
                include_comments=False,
                include_tables=True,
                include_formatting=False,
            )
            or ""
        )

    return run


def _readability_runner() -> Any:
    import lxml.html
    from readability import Document

    def run(url: str, body: bytes) -> str:
        summary = Document(body).summary(html_partial=True)
        return str(lxml.html.fromstring(summary).text_content()) if summary.strip() else ""

    return run


def worker(system: str, listing: Path) -> None:
    """Serve extractions one page at a time: read a page's index on stdin, answer one JSON line
    with its text and the CPU seconds the call took."""
    runner = {
        "crawld": _crawld_runner,
        "trafilatura": _trafilatura_runner,
        "readability": _readability_runner,
    }[system]()
    items = json.loads(listing.read_text())
    print("ready", flush=True)
    for line in sys.stdin:
        url, path = items[int(line)]
        body = Path(path).read_bytes()
        start = time.process_time()
        try:
            text = runner(url, body)
        except Exception as exc:  # a crash is a full miss, as in the corpus's own evaluation
            text = ""
            print(f"{system}: {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        seconds = time.process_time() - start
        print(json.dumps({"seconds": seconds, "text": text}), flush=True)


def run_interleaved(pages: int, listing: Path, tmp: str) -> dict[str, dict[str, Any]]:
    """Each system in its own worker process, all started first, then page by page: each page
    goes to every system in turn, so all three are timed at nearly the same moment of the
    machine's load (one system after the other over the whole corpus moved the ratio by 0.3x
    between runs on a busy machine)."""
    procs = {
        system: subprocess.Popen(
            [sys.executable, __file__, "--worker", system, "--listing", str(listing)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tmp,
            env={**os.environ, "PYTHONPATH": ""},
        )
        for system in SYSTEMS
    }
    results: dict[str, dict[str, Any]] = {s: {"seconds": 0.0, "outputs": {}} for s in SYSTEMS}
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        urls = [url for url, _ in json.loads(listing.read_text())]
        order = list(procs.items())
        for index in range(pages):
            shift = index % len(order)  # each system first on a third of the pages
            for system, proc in order[shift:] + order[:shift]:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(f"{index}\n")
                proc.stdin.flush()
                answer = json.loads(proc.stdout.readline())
                results[system]["seconds"] += answer["seconds"]
                results[system]["outputs"][urls[index]] = answer["text"]
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait()
    return results


# --- scoring --------------------------------------------------------------------------------------

_MD_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]*)\]\((?:[^()]|\([^)]*\))*\)")
_MD_REF = re.compile(r"^\s*\[[^\]]+\]:\s+\S+.*$", re.M)
_MD_PREFIX = re.compile(r"^\s*(?:#{1,6}\s+|>\s?|[-*+]\s+)", re.M)
_MD_FENCE = re.compile(r"^\s*(```|~~~).*$", re.M)
_MD_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}.*$", re.M)
_MD_EMPHASIS = re.compile(r"(?<![\\\w*])(\*{1,3}|`+|~~)(?=[^\s*])(.+?)(?<=[^\s\\*])\1(?![\w*])")
_MD_TABLE_ROW = re.compile(r"^\s*\|.*$", re.M)
_MD_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|<>~])")


def markdown_text(markdown: str) -> str:
    """Markdown reduced to the text a reader sees (list numbers are seen, bullets are not; a
    table's pipes are not, a "|" in a paragraph or heading is)."""
    text = _MD_IMAGE.sub(" ", markdown)
    text = _MD_LINK.sub(r"\1", text)
    text = _MD_REF.sub("", text)
    text = _MD_FENCE.sub("", text)
    text = _MD_TABLE_RULE.sub("", text)
    text = _MD_PREFIX.sub("", text)
    text = _MD_TABLE_ROW.sub(lambda row: re.sub(r"(?<!\\)\|", " ", row.group()), text)
    text = _MD_EMPHASIS.sub(r"\2", text)
    return _MD_ESCAPE.sub(r"\1", text)


def score(
    pages: list[tuple[str, Path, dict[str, Any]]], outputs: dict[str, str]
) -> dict[str, float]:
    tp = fp = fn = tn = 0
    for url, _, item in pages:
        result = _norm(outputs.get(url, ""))
        found = sum(1 for w in item["with"] if _norm(w) in result)
        leaked = sum(1 for w in item["without"] if _norm(w) in result)
        tp += found
        fn += len(item["with"]) - found
        fp += leaked
        tn += len(item["without"]) - leaked
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    accuracy = (tp + tn) / (tp + fp + fn + tn)
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": accuracy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--limit", type=int, default=0, help="only the first N pages")
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--listing", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dump", type=Path, help="write every system's text per page (JSON)")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.listing)
        return
    pages = load_corpus(args.data)
    if args.limit:
        pages = pages[: args.limit]
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "pages.json"
        listing.write_text(json.dumps([(url, str(path)) for url, path, _ in pages]))
        results = run_interleaved(len(pages), listing, tmp)
    results["crawld"]["outputs"] = {
        url: markdown_text(md) for url, md in results["crawld"]["outputs"].items()
    }
    if args.dump:
        args.dump.write_text(
            json.dumps({s: r["outputs"] for s, r in results.items()}, ensure_ascii=False)
        )
    chunks = sum(len(item["with"]) + len(item["without"]) for _, _, item in pages)
    print(f"corpus: {SOURCE}: {len(pages)} pages, {chunks} snippets")
    print(f"{'system':<12} {'precision':>9} {'recall':>7} {'F1':>6} {'accuracy':>8} {'ms/page':>8}")
    scores = {}
    for system in SYSTEMS:
        s = scores[system] = score(pages, results[system]["outputs"])
        ms = 1000 * results[system]["seconds"] / max(1, len(pages))
        s["ms"] = ms
        print(
            f"{system:<12} {s['precision']:>9.3f} {s['recall']:>7.3f} {s['f1']:>6.3f} "
            f"{s['accuracy']:>8.3f} {ms:>8.1f}"
        )
    crawld, base = scores["crawld"], scores["trafilatura"]
    print(
        f"crawld F1 {crawld['f1']:.3f} = {crawld['f1'] / base['f1']:.3f}x trafilatura "
        f"(recall {crawld['recall'] / base['recall']:.3f}x, "
        f"ms/page {crawld['ms'] / base['ms']:.2f}x)"
    )


if __name__ == "__main__":
    main()
