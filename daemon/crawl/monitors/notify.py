# What a monitor's notifications are, as pure rules over plain values, so each is tested as a
# table: the `notification` object a request may send (Firecrawl's `email` through the operator's
# relay, and crawld's `targets`, names of destinations the operator configured: a request never
# gives a URL, so the daemon never connects where a request chooses), the channels a monitor
# notifies, which pages of a finished check are worth telling (changed, new, removed, error; with
# a judging goal, changed pages judged noise are dropped, and a check left with none sends
# nothing), the message (monitor, check, counts, URLs, a short diff excerpt), what the check's
# `notificationStatus` answers, and when a failed attempt is retried. notifier.py is the thin
# trio task that records and delivers.
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from daemon.crawl.monitors.config import ADDRESS
from daemon.crawl.problems import Problem, problem, unknown_keys

EMAIL = "email"
TARGET_PREFIX = "target:"
MAX_RECIPIENTS = 25
MAX_TARGETS = 10
NOTABLE = ("changed", "new", "removed", "error")
MAX_PAGES_LISTED = 50
EXCERPT_LINES = 12
LINE_CHARS = 200
MAX_TEXT = 64 * 1024
NO_EMAIL = ("email notifications need an SMTP relay, which this crawld has not configured"
            " ([monitors.smtp]); use a webhook or notification.targets")  # fmt: skip

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
"""What a subject line may not hold (a header would break on a line feed)."""
NOTIFICATION_KEYS = frozenset({"email", "targets"})
EMAIL_KEYS = frozenset({"enabled", "recipients", "includeDiffs"})


class Message(msgspec.Struct, frozen=True):
    """One notification as recorded and sent: `recipients` for the email channel only."""

    subject: str
    text: str
    recipients: list[str] = []


class Noted(msgspec.Struct, frozen=True):
    """What a message says of one page."""

    url: str
    status: str
    diff_text: str | None = None
    judgment: dict[str, Any] | None = None
    error: str | None = None


def target_channel(name: str) -> str:
    return TARGET_PREFIX + name


def _email(raw: Any, smtp_ready: bool, allows: Callable[[str], bool]
           ) -> tuple[dict[str, Any] | None, list[Problem]]:  # fmt: skip
    at = "$.notification.email"
    if not isinstance(raw, dict):
        return None, [problem(at, "an object with `enabled` and `recipients`")]
    problems = unknown_keys(raw, EMAIL_KEYS, at)
    enabled = raw.get("enabled", False)
    diffs = raw.get("includeDiffs", False)
    recipients = raw.get("recipients", [])
    if not isinstance(enabled, bool):
        problems.append(problem(f"{at}.enabled", "a boolean"))
    if not isinstance(diffs, bool):
        problems.append(problem(f"{at}.includeDiffs", "a boolean"))
    if not isinstance(recipients, list) or len(recipients) > MAX_RECIPIENTS:
        problems.append(
            problem(f"{at}.recipients", f"a list of at most {MAX_RECIPIENTS} addresses")
        )
        recipients = []
    for i, address in enumerate(recipients):
        if not isinstance(address, str) or not ADDRESS.match(address) or len(address) > 254:
            problems.append(problem(f"{at}.recipients[{i}]", "an e-mail address"))
        elif not allows(address):
            problems.append(problem(f"{at}.recipients[{i}]", "not an address this crawld may"
                                    " send to ([monitors.smtp] allowed_recipients)"))  # fmt: skip
    if enabled is True and not smtp_ready:
        problems.append(problem(f"{at}.enabled", NO_EMAIL))
    elif enabled is True and not recipients:
        problems.append(problem(f"{at}.recipients", "at least one address when enabled"))
    unique = list(dict.fromkeys(str(r) for r in recipients))
    return {"enabled": enabled, "recipients": unique, "includeDiffs": diffs}, problems


def _targets(raw: Any, known: frozenset[str]) -> tuple[list[str], list[Problem]]:
    at = "$.notification.targets"
    if not isinstance(raw, list) or len(raw) > MAX_TARGETS:
        return [], [problem(at, f"a list of at most {MAX_TARGETS} target names")]
    problems = []
    for i, name in enumerate(raw):
        if not isinstance(name, str):
            problems.append(problem(f"{at}[{i}]", "a target's name"))
        elif "://" in name or ":" in name:
            problems.append(
                problem(
                    f"{at}[{i}]",
                    "a name from [monitors] notification_targets,"
                    " not a URL: crawld sends only where its config says",
                )
            )
        elif name not in known:
            problems.append(problem(f"{at}[{i}]", f"no notification target named {name[:64]!r}"
                                    " in [monitors] notification_targets"))  # fmt: skip
    return list(dict.fromkeys(n for n in raw if isinstance(n, str))), problems


def parse(raw: Any, *, smtp_ready: bool, targets: frozenset[str],
          allows: Callable[[str], bool] = lambda _: True
          ) -> tuple[dict[str, Any] | None, list[Problem]]:  # fmt: skip
    """A request's `notification`, normalised (`email` with its three fields, `targets` without
    repeats), and the problems naming each bad field."""
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        return None, [problem("$.notification", "an object with `email` and/or `targets`")]
    problems = unknown_keys(raw, NOTIFICATION_KEYS, "$.notification")
    out: dict[str, Any] = {}
    if raw.get("email") is not None:
        out["email"], more = _email(raw["email"], smtp_ready, allows)
        problems += more
    if raw.get("targets") is not None:
        out["targets"], more = _targets(raw["targets"], targets)
        problems += more
    return out, problems


def schema(*, smtp_ready: bool, targets: Sequence[str]) -> dict[str, Any]:
    """`notification` as this deployment takes it, for /openapi.json: email only with a relay
    (and then with recipients), targets by the configured names (none configured: none)."""
    address = {"type": "string", "maxLength": 254, "pattern": ADDRESS.pattern}
    email: dict[str, Any] = {
        "type": ["object", "null"], "additionalProperties": False,
        "properties": {
            "enabled": {"type": "boolean"} if smtp_ready else {"enum": [False]},
            "recipients": {"type": "array", "maxItems": MAX_RECIPIENTS, "items": address},
            "includeDiffs": {"type": "boolean"},
        },
    }  # fmt: skip
    if smtp_ready:
        email["if"] = {"type": "object", "required": ["enabled"],
                       "properties": {"enabled": {"const": True}}}  # fmt: skip
        email["then"] = {"required": ["recipients"], "properties": {"recipients": {"minItems": 1}}}
    names: dict[str, Any] = {"enum": list(targets)} if targets else {"not": {}}
    return {"MonitorNotification": {
        "type": ["object", "null"], "additionalProperties": False,
        "properties": {
            "email": email,
            "targets": {"type": ["array", "null"], "maxItems": MAX_TARGETS, "items": names},
        },
        "description": "email needs [monitors.smtp] (and may be limited to its"
        " allowed_recipients); targets are names from [[monitors.notification_targets]]",
    }}  # fmt: skip


def channels(notification: dict[str, Any] | None) -> list[str]:
    """The channels a monitor with this (normalised) `notification` notifies."""
    if not notification:
        return []
    found = []
    email = notification.get("email") or {}
    if email.get("enabled") and email.get("recipients"):
        found.append(EMAIL)
    found += [target_channel(n) for n in notification.get("targets") or []]
    return found


def worth(pages: Sequence[Noted], judging: bool) -> list[Noted]:
    """The pages a notification tells: changed, new, removed and error ones, less (when the
    monitor judges changes against a goal) changed pages and new search results the model
    judged not meaningful. A page without a judgment (the model failed) is told: better a false
    alert than a missed one."""
    told = []
    for page in pages:
        if page.status not in NOTABLE:
            continue
        if (
            judging
            and page.status in ("changed", "new")
            and (page.judgment or {}).get("meaningful") is False
        ):
            continue
        told.append(page)
    return told


def excerpt(diff_text: str | None) -> list[str]:
    """The first changed lines of a unified diff, each cut to LINE_CHARS."""
    if not diff_text:
        return []
    lines = []
    for line in diff_text.splitlines():
        if line.startswith(("+++", "---")) or not line.startswith(("+", "-")):
            continue
        lines.append(line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + "…")
        if len(lines) == EXCERPT_LINES:
            break
    return lines


def _counts(summary: dict[str, int]) -> str:
    parts = [f"{summary.get(k, 0)} {k}" for k in ("changed", "new", "removed", "error")
             if summary.get(k)]  # fmt: skip
    return ", ".join(parts) or "no changes"


def render(*, name: str, monitor_id: str, check_id: str, status: str, summary: dict[str, int],
           pages: Sequence[Noted], diffs: bool, recipients: Sequence[str] = ()
           ) -> Message:  # fmt: skip
    """The message of a check: its monitor, id, counts, the told pages' URLs (the first
    MAX_PAGES_LISTED) and, with `diffs`, a short excerpt of each changed page's diff."""
    subject = _CONTROL.sub(" ", f"[crawld] {name}: {_counts(summary)}")
    lines = [
        f"Monitor: {name} ({monitor_id})",
        f"Check: {check_id} ({status})",
        f"Pages: {summary.get('totalPages', 0)} checked; {_counts(summary)};"
        f" {summary.get('same', 0)} same",
        "",
    ]
    for page in pages[:MAX_PAGES_LISTED]:
        lines.append(f"{page.status}: {page.url}")
        judgment = page.judgment
        if judgment is not None:
            verdict = "meaningful" if judgment.get("meaningful") else "not meaningful"
            reason = str(judgment.get("reason") or "")[:LINE_CHARS]
            lines.append(f"  judged {verdict} ({judgment.get('confidence')}): {reason}")
        if page.error:
            lines.append(f"  error: {page.error[:LINE_CHARS]}")
        if diffs:
            lines += [f"  {line}" for line in excerpt(page.diff_text)]
    if len(pages) > MAX_PAGES_LISTED:
        lines.append(f"… and {len(pages) - MAX_PAGES_LISTED} more pages")
    lines += ["", f"Details: GET /v2/monitor/{monitor_id}/checks/{check_id}"]
    text = "\n".join(lines)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "\n… (cut)"
    return Message(subject=subject[:200], text=text, recipients=list(recipients))


def status_json(notification: dict[str, Any] | None, states: dict[str, str], finished: bool
                ) -> dict[str, Any] | None:  # fmt: skip
    """A check's `notificationStatus`: None when its monitor notifies nothing or the check has
    not finished; else each channel's state: `pending` (recorded, being sent or retried),
    `sent`, `failed` (its retries spent, or it cannot be sent), or `skipped` (the check had
    nothing worth telling). Targets are answered under `targets` by name."""
    wanted = channels(notification)
    if not wanted or not finished:
        return None
    out: dict[str, Any] = {}
    for channel in wanted:
        state = states.get(channel, "skipped")
        if channel == EMAIL:
            out[EMAIL] = state
        else:
            out.setdefault("targets", {})[channel[len(TARGET_PREFIX) :]] = state
    return out


def retry_delay(attempts: int, schedule: Sequence[float]) -> float | None:
    """Seconds before the next attempt after `attempts` failed ones; None once the schedule's
    retries are spent."""
    if attempts < 1 or attempts > len(schedule):
        return None
    return float(schedule[attempts - 1])
