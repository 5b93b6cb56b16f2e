# Logs go to stderr, one line per record, so journald stores each line at the right level when
# every line (tracebacks included) starts with a `<N>` syslog priority. The prefix is written only
# when stderr is journald's stream (systemd sets JOURNAL_STREAM to its device:inode); on a terminal
# or a pipe it would be noise. Context travels as
# `key=value` pairs (component=, task=, job=) that `journalctl -g` can find. A URL in a value
# (an upstream, a webhook, the broker) is redacted on its way out: its password and query values
# are not for the journal.
from __future__ import annotations

import io
import logging
import os
import sys
import traceback
from typing import Any

from daemon.redact import redact_text

_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def syslog_priority(levelno: int) -> int:
    for level in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO):
        if levelno >= level:
            return _PRIORITY[level]
    return 7


def _escape(char: str) -> str:
    # Control characters are escaped, not passed through: journalctl shows a message holding one
    # as "[N B blob data]" instead of its text.
    if char in '\\"':
        return "\\" + char
    return char if char.isprintable() else ascii(char)[1:-1]


def format_context(context: dict[str, Any]) -> str:
    parts = []
    for key, value in context.items():
        if value is None:
            continue
        text = redact_text(str(value))
        if not text or any(c in '"=' or c.isspace() or not c.isprintable() for c in text):
            text = '"' + "".join(map(_escape, text)) + '"'
        parts.append(f"{key}={text}")
    return " ".join(parts)


def is_journal_stream(stream: Any) -> bool:
    """Whether `stream` is the journald stream systemd named in $JOURNAL_STREAM ("dev:inode")."""
    dev, sep, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not sep:
        return False
    try:
        st = os.fstat(stream.fileno())
        return (st.st_dev, st.st_ino) == (int(dev), int(inode))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


class JournalFormatter(logging.Formatter):
    """`<N>logger: message key=value …`, with every traceback line prefixed too (without the
    `<N>` when `priority_prefix` is false)."""

    def __init__(self, priority_prefix: bool = True) -> None:
        super().__init__()
        self.priority_prefix = priority_prefix

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>" if self.priority_prefix else ""
        message = record.getMessage()
        context = getattr(record, "ctx", None)
        if context:
            message = f"{message} {format_context(context)}"
        # journald makes one entry of every line, so each line gets the prefix.
        lines = f"{record.name}: {message}".split("\n")
        if record.exc_info:
            lines.extend(
                line
                for chunk in traceback.format_exception(*record.exc_info)
                for line in chunk.rstrip("\n").split("\n")
            )
        if record.stack_info:
            lines.extend(self.formatStack(record.stack_info).split("\n"))
        return "\n".join(prefix + line for line in lines)


def setup_logging(level: str = "info") -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_crawld", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JournalFormatter(priority_prefix=is_journal_stream(sys.stderr)))
    handler._crawld = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
    # One line per upstream request would drown the daemon's own lines; crawld logs what matters
    # about a request (retries, errors, requestId) itself.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


class ContextLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger whose calls take context as keyword arguments: log.info("msg", task="x")."""

    def _log_with(
        self, level: int, msg: str, args: Any, exc_info: Any, ctx: dict[str, Any]
    ) -> None:
        if self.logger.isEnabledFor(level):
            merged = {**(self.extra or {}), **ctx}
            # stacklevel=3 skips this method and the public one: records point at the caller.
            self.logger.log(
                level, msg, *args, exc_info=exc_info, extra={"ctx": merged}, stacklevel=3
            )

    def debug(self, msg: str, *args: Any, exc_info: Any = None, **ctx: Any) -> None:  # type: ignore[override]
        self._log_with(logging.DEBUG, msg, args, exc_info, ctx)

    def info(self, msg: str, *args: Any, exc_info: Any = None, **ctx: Any) -> None:  # type: ignore[override]
        self._log_with(logging.INFO, msg, args, exc_info, ctx)

    def warning(self, msg: str, *args: Any, exc_info: Any = None, **ctx: Any) -> None:  # type: ignore[override]
        self._log_with(logging.WARNING, msg, args, exc_info, ctx)

    def error(self, msg: str, *args: Any, exc_info: Any = None, **ctx: Any) -> None:  # type: ignore[override]
        self._log_with(logging.ERROR, msg, args, exc_info, ctx)

    def exception(self, msg: str, *args: Any, exc_info: Any = True, **ctx: Any) -> None:  # type: ignore[override]
        self._log_with(logging.ERROR, msg, args, exc_info, ctx)

    def critical(self, msg: str, *args: Any, exc_info: Any = None, **ctx: Any) -> None:  # type: ignore[override]
        self._log_with(logging.CRITICAL, msg, args, exc_info, ctx)


def get_logger(name: str, **context: Any) -> ContextLogger:
    """A logger named `crawld.<name>` whose records carry `context` as key=value pairs."""
    return ContextLogger(logging.getLogger(f"crawld.{name}"), context)
