"""Firecrawl's MCP server (firecrawl-mcp, tests/js/mcp_parse.test.mjs) in local mode: its
`firecrawl_parse` reads a file from disk and posts it as multipart to crawld's /v2/parse, with
`pdfOptions.maxPages` as a pdf parser's maxPages; a file crawld refuses is the tool's error."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import trio

from tests.crawl import documents as docs
from tests.crawl.pdfs import encrypt_pdf, make_pdf
from tests.crawlapi.test_sdk_js import JS, node_or_fail

pytestmark = pytest.mark.node  # drives Node: the MCP's wire format, not the store


async def test_firecrawl_mcp_parses_local_files_through_crawld(
    base_url: str, tmp_path: Path
) -> None:
    node = node_or_fail()
    if not (JS / "node_modules" / "firecrawl-mcp").is_dir():
        pytest.fail("tests/js/node_modules has no firecrawl-mcp (cd tests/js && npm ci)")
    (tmp_path / "four.pdf").write_bytes(make_pdf(["Alpha page text", "Beta page text",
                                                  "Gamma page text", "Delta page text"]))  # fmt: skip
    (tmp_path / "memo.docx").write_bytes(
        docs.docx(["Memo"], [["region", "sales"], ["north", "12"]])
    )
    (tmp_path / "enc.pdf").write_bytes(encrypt_pdf(make_pdf(["secret"])))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "CRAWLD_URL": base_url,
        "FILES": str(tmp_path),
        "NODE_NO_WARNINGS": "1",
    }
    command = [node, "--test", "--test-reporter=tap", str(JS / "mcp_parse.test.mjs")]
    with trio.fail_after(120):
        done = await trio.run_process(command, cwd=JS, env=env, capture_stdout=True,
                                      capture_stderr=True, check=False)  # fmt: skip
    out = done.stdout.decode()
    summary = dict(re.findall(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M))
    assert done.returncode == 0 and summary.get("fail") == "0", out[-6000:] + done.stderr.decode()
    assert summary["pass"] == "3", out[-3000:]
