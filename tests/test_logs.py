# journald stores each stderr line as its own entry at the priority of its `<N>` prefix, so the
# formatter's contract is checked line by line: no line may leave without a prefix.
from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.logs import (
    JournalFormatter,
    format_context,
    get_logger,
    is_journal_stream,
    setup_logging,
    syslog_priority,
)


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """Formatted output of everything logged under `crawld`."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JournalFormatter())
    logger = logging.getLogger("crawld")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def lines_of(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


@pytest.mark.parametrize(
    ("levelno", "priority"),
    [
        (logging.CRITICAL, 2),
        (logging.ERROR, 3),
        (logging.WARNING, 4),
        (logging.INFO, 6),
        (logging.DEBUG, 7),
        (logging.CRITICAL + 10, 2),
        (logging.ERROR + 5, 3),
        (logging.INFO + 5, 6),
        (5, 7),
        (logging.NOTSET, 7),
    ],
)
def test_syslog_priority(levelno: int, priority: int) -> None:
    assert syslog_priority(levelno) == priority


def test_context_logger_line(stream: io.StringIO) -> None:
    get_logger("collector").info("m", task="a b")
    assert stream.getvalue() == '<6>crawld.collector: m task="a b"\n'


def test_each_level_gets_its_prefix(stream: io.StringIO) -> None:
    log = get_logger("x")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    log.critical("c")
    assert lines_of(stream) == [
        "<7>crawld.x: d",
        "<6>crawld.x: i",
        "<4>crawld.x: w",
        "<3>crawld.x: e",
        "<2>crawld.x: c",
    ]


def test_bound_context_merges_with_call_context(stream: io.StringIO) -> None:
    log = get_logger("collector", component="collector", task="old")
    log.warning("page %d failed", 3, task="jobs-beijing", attempt=2, job=None)
    assert lines_of(stream) == [
        "<4>crawld.collector: page 3 failed component=collector task=jobs-beijing attempt=2"
    ]


def test_plain_loggers_work_too(stream: io.StringIO) -> None:
    logging.getLogger("crawld.http").error("bind failed on %s", "127.0.0.1:8700")
    assert lines_of(stream) == ["<3>crawld.http: bind failed on 127.0.0.1:8700"]


def test_level_filtering(stream: io.StringIO) -> None:
    logging.getLogger("crawld").setLevel(logging.INFO)
    get_logger("x").debug("hidden", task="t")
    assert stream.getvalue() == ""


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("plain", "plain"),
        (42, "42"),
        (1.5, "1.5"),
        ("é-ok", "é-ok"),
        ("back\\slash", "back\\slash"),
        ("", '""'),
        ("a b", '"a b"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a=b", '"a=b"'),
        ("two\nlines", '"two\\nlines"'),
        ("tab\there", '"tab\\there"'),
        ("cr\rhere", '"cr\\rhere"'),
        ("esc\x1b[31m", '"esc\\x1b[31m"'),
        ('c:\\ "x"', '"c:\\\\ \\"x\\""'),
        ("nbsp\u00a0x", '"nbsp\\xa0x"'),
    ],
)
def test_context_quoting(value: object, rendered: str) -> None:
    assert format_context({"k": value}) == f"k={rendered}"


def test_context_skips_none_and_keeps_order() -> None:
    assert format_context({"b": 1, "skip": None, "a": "x y"}) == 'b=1 a="x y"'
    assert format_context({}) == ""


def test_every_traceback_line_is_prefixed(stream: io.StringIO) -> None:
    log = get_logger("jobs", job="j1")
    try:
        raise ValueError("boom\nsecond line of the message")
    except ValueError:
        log.exception("drain failed", attempt=1)
    lines = lines_of(stream)
    assert lines[0] == "<3>crawld.jobs: drain failed job=j1 attempt=1"
    assert lines[1] == "<3>Traceback (most recent call last):"
    assert lines[-2:] == ["<3>ValueError: boom", "<3>second line of the message"]
    assert all(line.startswith("<3>") for line in lines)
    assert any("test_every_traceback_line_is_prefixed" in line for line in lines)


def test_exc_info_on_other_levels(stream: io.StringIO) -> None:
    table: dict[str, int] = {}
    try:
        table["missing"]
    except KeyError:
        get_logger("x").warning("lookup failed", exc_info=True)
    lines = lines_of(stream)
    assert len(lines) > 3
    assert all(line.startswith("<4>") for line in lines)
    assert lines[-1] == "<4>KeyError: 'missing'"


def test_exception_group_lines_are_prefixed(stream: io.StringIO) -> None:
    try:
        raise ExceptionGroup("components failed", [RuntimeError("a"), OSError("b")])
    except ExceptionGroup:
        get_logger("supervise").critical("giving up", exc_info=True)
    lines = lines_of(stream)
    assert all(line.startswith("<2>") for line in lines)
    text = "\n".join(lines)
    assert "RuntimeError: a" in text
    assert "OSError: b" in text


def test_multiline_message_is_prefixed_on_every_line(stream: io.StringIO) -> None:
    get_logger("config").error("bad config:\n  at $.http.bind\n", file="/etc/crawld/config.toml")
    assert lines_of(stream) == [
        "<3>crawld.config: bad config:",
        "<3>  at $.http.bind",
        "<3> file=/etc/crawld/config.toml",
    ]


def test_stack_info_is_prefixed(stream: io.StringIO) -> None:
    logging.getLogger("crawld.x").info("where am I", stack_info=True)
    lines = lines_of(stream)
    assert lines[0] == "<6>crawld.x: where am I"
    assert lines[1] == "<6>Stack (most recent call last):"
    assert len(lines) > 3
    assert all(line.startswith("<6>") for line in lines)


def test_records_point_at_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="crawld")
    log = get_logger("x")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    log.critical("c")
    try:
        raise RuntimeError
    except RuntimeError:
        log.exception("x")
    assert [r.funcName for r in caplog.records] == ["test_records_point_at_the_caller"] * 6
    assert {r.pathname for r in caplog.records} == {__file__}


@pytest.fixture
def restore_root() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_setup_logging_writes_prefixed_lines_to_stderr(
    restore_root: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging("warning")
    setup_logging("debug")  # again, as a reload does: still one handler
    ours = [h for h in restore_root.handlers if getattr(h, "_crawld", False)]
    assert len(ours) == 1
    assert isinstance(ours[0], logging.StreamHandler)
    assert ours[0].stream is sys.stderr
    assert restore_root.level == logging.DEBUG
    get_logger("app").debug("starting", version="0.1.0")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "crawld.app: starting version=0.1.0\n"  # not journald: no <N>


def test_the_priority_prefix_only_goes_to_journald(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open(tmp_path / "journal", "w") as journal, open(tmp_path / "tty", "w") as other:
        st = os.fstat(journal.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert is_journal_stream(journal)
        assert not is_journal_stream(other)
        assert not is_journal_stream(io.StringIO())
        for value in ("", "garbage", f"{st.st_dev}:", f"x:{st.st_ino}"):
            monkeypatch.setenv("JOURNAL_STREAM", value)
            assert not is_journal_stream(journal)
        monkeypatch.delenv("JOURNAL_STREAM")
        assert not is_journal_stream(journal)
    record = logging.LogRecord("crawld.x", logging.ERROR, __file__, 1, "boom", (), None)
    assert JournalFormatter(priority_prefix=False).format(record) == "crawld.x: boom"
    assert JournalFormatter().format(record) == "<3>crawld.x: boom"
