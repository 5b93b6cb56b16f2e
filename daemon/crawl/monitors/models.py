# What /v2/monitor clients send and get back. A create (or a PATCH merged over the stored
# definition) is checked whole and every problem named by its field path, Firecrawl's 400: the
# schedule (cron or Firecrawl's text forms, an IANA zone, no more often than [monitors]
# min_interval), 1..50 targets whose options are checked by the same readers as /v2/scrape and
# /v2/crawl, the webhook by the jobs part's rules, the notification by notify.py's. The stored
# definition (MonitorSpec) keeps the schedule normalised to cron and every target with an id; the
# answers are built from it in Firecrawl's shapes, with every field firecrawl-py 4.55 requires.
from __future__ import annotations

import uuid
from typing import Any

import msgspec

from daemon.config import WebhookSpec
from daemon.crawl.fetching.urls import compile_paths
from daemon.crawl.monitors import notify, schedule
from daemon.crawl.monitors.config import SmtpConfig
from daemon.crawl.options.llm_formats import LlmCheck
from daemon.crawl.options.models import CrawlPlan, ScrapeRequest, parse_crawl, parse_scrape
from daemon.crawl.options.scrape_options import SCRAPE_KEYS
from daemon.crawl.problems import BadRequest, Problem, problem
from daemon.jobs.records import iso_ms

MAX_TARGETS = 50
MAX_URLS = 100
"""URLs of one scrape target (Firecrawl states none; a check fetches them all)."""
MAX_NAME = 256
DEFAULT_RETENTION_DAYS = 30
MAX_RETENTION_DAYS = 365
EVENTS = ("monitor.page", "monitor.check.completed")
CREATE_KEYS = frozenset({"name", "schedule", "targets", "webhook", "notification",
                         "retentionDays", "goal", "judgeEnabled", "origin",
                         "integration"})  # fmt: skip
UPDATE_KEYS = CREATE_KEYS | {"status"}
TARGET_KEYS = {
    "scrape": frozenset({"id", "type", "urls", "scrapeOptions", "ignorePatterns"}),
    "crawl": frozenset({"id", "type", "url", "crawlOptions", "scrapeOptions", "ignorePatterns"}),
    "search": frozenset(
        {"id", "type", "queries", "searchWindow", "includeDomains", "excludeDomains", "maxResults"}
    ),
}
SEARCH_WINDOWS = {"5m": "qdr:h", "15m": "qdr:h", "1h": "qdr:h", "6h": "qdr:d", "24h": "qdr:d",
                  "7d": "qdr:w"}  # fmt: skip
"""A search target's window as the search's `tbs` (SearXNG's shortest range is a day)."""
MAX_QUERIES = 10
MAX_RESULTS = 50
NO_SEARCH = "a search target needs a search provider ([search] base_url)"
NEEDS_GOAL = "a search target needs a `goal` (or judgeEnabled false)"


class MonitorSpec(msgspec.Struct, kw_only=True):
    """A monitor's validated definition, as stored."""

    name: str
    cron: str
    timezone: str
    jitter_ms: int = 0
    targets: list[dict[str, Any]]
    webhook: dict[str, Any] | None = None
    notification: dict[str, Any] | None = None
    retentionDays: int = DEFAULT_RETENTION_DAYS
    goal: str | None = None
    judgeEnabled: bool = False


_spec_decoder = msgspec.json.Decoder(MonitorSpec)
encode = msgspec.json.Encoder().encode
decode_any = msgspec.json.Decoder().decode


def decode_spec(raw: bytes) -> MonitorSpec:
    return _spec_decoder.decode(raw)


def _prefixed(problems: list[Problem], at: str, renames: dict[str, str]) -> list[Problem]:
    out = []
    for p in problems:
        path = str(p["path"])
        for old, new in renames.items():
            if path == old or path.startswith(old + "."):
                path = new + path[len(old) :]
                break
        else:
            path = at + path[1:]
        out.append(problem(path, p["message"]))
    return out


def _formats(options: dict[str, Any], tag: str | None) -> list[Any]:
    """The target's formats with markdown always, and a changeTracking format's snapshots kept
    under the monitor target's own `tag` (so its JSON diff compares with this target's last
    check, not with anyone's last scrape of the URL)."""
    formats: list[Any] = []
    for fmt in options.get("formats") or ["markdown"]:
        if isinstance(fmt, dict) and fmt.get("type") == "changeTracking" and tag is not None:
            fmt = {**fmt, "tag": tag}
        formats.append(fmt)
    if "markdown" not in formats:
        formats.append("markdown")
    return formats


def tracking_modes(target: dict[str, Any]) -> tuple[str, ...]:
    """The changeTracking modes the target's formats ask for (none: markdown diffs only)."""
    for fmt in (target.get("scrapeOptions") or {}).get("formats") or []:
        if isinstance(fmt, dict) and fmt.get("type") == "changeTracking":
            return tuple(fmt.get("modes") or ("git-diff",))
    return ()


def scrape_request(
    url: str,
    options: dict[str, Any] | None,
    *,
    browser: bool,
    llm: LlmCheck | None = None,
    tag: str | None = None,
) -> ScrapeRequest:
    """A scrape target's URL as a /v2/scrape request: never from the cache, markdown always."""
    body = dict(options or {})
    body.update(url=url, formats=_formats(body, tag), maxAge=0)
    return parse_scrape(encode(body), browser=browser, llm=llm)


def crawl_plan(target: dict[str, Any], *, default_limit: int, browser: bool,
               llm: LlmCheck | None = None, tag: str | None = None) -> CrawlPlan:  # fmt: skip
    """A crawl target as a /v2/crawl request: never from the cache, markdown always."""
    options = dict(target.get("scrapeOptions") or {})
    options.update(formats=_formats(options, tag), maxAge=0)
    body = {**(target.get("crawlOptions") or {}), "url": target.get("url"),
            "scrapeOptions": options}  # fmt: skip
    return parse_crawl(encode(body), default_limit=default_limit, browser=browser, llm=llm)


def _search_problems(target: dict[str, Any], at: str, search: bool) -> list[Problem]:
    if not search:
        return [problem(f"{at}.type", NO_SEARCH)]
    queries = target.get("queries")
    if (
        not isinstance(queries, list)
        or not 1 <= len(queries) <= MAX_QUERIES
        or not all(isinstance(q, str) and 0 < len(q.strip()) <= 500 for q in queries)
    ):
        return [problem(f"{at}.queries", f"a list of 1 to {MAX_QUERIES} queries")]
    problems = []
    if target.get("searchWindow") not in (None, *SEARCH_WINDOWS):
        problems.append(problem(f"{at}.searchWindow", f"one of {', '.join(SEARCH_WINDOWS)}"))
    for key in ("includeDomains", "excludeDomains"):
        value = target.get(key)
        if value is not None and (
            not isinstance(value, list) or not all(isinstance(d, str) and d for d in value)
        ):
            problems.append(problem(f"{at}.{key}", "a list of domain names"))
    limit = target.get("maxResults")
    if limit is not None and (type(limit) is not int or not 1 <= limit <= MAX_RESULTS):
        problems.append(problem(f"{at}.maxResults", f"a number from 1 to {MAX_RESULTS}"))
    return problems


def camel_keys(options: dict[str, Any]) -> dict[str, Any]:
    """scrapeOptions with snake_case keys renamed to their camelCase (`exclude_tags` →
    `excludeTags`): firecrawl-py 4.55 sends a monitor target's ScrapeOptions dumped by field
    name, not in the camelCase its /v2/scrape sends."""
    out = {}
    for key, value in options.items():
        head, *rest = key.split("_")
        camel = head + "".join(part[:1].upper() + part[1:] for part in rest)
        out[camel if key not in SCRAPE_KEYS and camel in SCRAPE_KEYS else key] = value
    return out


def _target(raw: Any, at: str, seen: set[str], *, browser: bool, default_limit: int,
            search: bool, llm: LlmCheck | None = None
            ) -> tuple[dict[str, Any] | None, list[Problem]]:  # fmt: skip
    if not isinstance(raw, dict):
        return None, [problem(at, "a target is an object")]
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in TARGET_KEYS:
        return None, [problem(f"{at}.type", "one of scrape, crawl, search")]
    problems = [problem(f"{at}.{k}"[:200], "unrecognized key")
                for k in sorted(raw) if k not in TARGET_KEYS[kind]]  # fmt: skip
    target = dict(raw)
    if isinstance(target.get("scrapeOptions"), dict):
        target["scrapeOptions"] = camel_keys(target["scrapeOptions"])
    target_id = target.get("id") or str(uuid.uuid4())
    if not isinstance(target_id, str) or len(target_id) > 128:
        problems.append(problem(f"{at}.id", "a string of at most 128 characters"))
    elif target_id in seen:
        problems.append(problem(f"{at}.id", "two targets have this id"))
    seen.add(str(target_id))
    target["id"] = target_id
    for key in ("scrapeOptions", "crawlOptions"):
        if target.get(key) is not None and not isinstance(target[key], dict):
            problems.append(problem(f"{at}.{key}", "an object"))
    ignore = target.get("ignorePatterns")
    if ignore is not None:
        try:
            if not isinstance(ignore, list):
                raise ValueError("ignorePatterns: a list of regexes")
            compile_paths(ignore, field="ignorePatterns")
        except ValueError as exc:
            where, _, message = str(exc).partition(": ")
            problems.append(problem(f"{at}.{where}", message))
    if problems:
        return None, problems
    if kind == "search":
        problems = _search_problems(target, at, search)
        return (None, problems) if problems else (target, [])
    try:
        if kind == "scrape":
            urls = target.get("urls")
            if not isinstance(urls, list) or not urls or len(urls) > MAX_URLS:
                return None, [problem(f"{at}.urls", f"a list of 1 to {MAX_URLS} URLs")]
            for i, url in enumerate(urls):
                if not isinstance(url, str):
                    return None, [problem(f"{at}.urls[{i}]", "a URL string")]
                try:
                    scrape_request(url, target.get("scrapeOptions"), browser=browser, llm=llm)
                except BadRequest as exc:
                    renames = {"$.url": f"{at}.urls[{i}]"}
                    return None, _prefixed(exc.details, f"{at}.scrapeOptions", renames)
        else:
            crawl_plan(target, default_limit=default_limit, browser=browser, llm=llm)
    except BadRequest as exc:
        renames = {"$.url": f"{at}.url", "$.scrapeOptions": f"{at}.scrapeOptions"}
        return None, _prefixed(exc.details, f"{at}.crawlOptions", renames)
    return target, []


def _schedule(raw: Any, monitor_id: str, min_interval_ms: int, now_ms: int
              ) -> tuple[tuple[str, str, int] | None, list[Problem]]:  # fmt: skip
    if not isinstance(raw, dict):
        return None, [problem("$.schedule", "required object with `cron` or `text`")]
    unknown = [problem(f"$.schedule.{k}"[:200], "unrecognized key")
               for k in sorted(raw) if k not in ("cron", "text", "timezone")]  # fmt: skip
    if unknown:
        return None, unknown
    tz_name = raw.get("timezone") or "UTC"
    cron_text, text = raw.get("cron"), raw.get("text")
    if (cron_text is None) == (text is None):
        return None, [problem("$.schedule", "exactly one of `cron` or `text`")]
    field = "$.schedule.cron" if cron_text is not None else "$.schedule.text"
    try:
        if not isinstance(tz_name, str):
            raise schedule.ScheduleError("an IANA time zone name")
        tz = schedule.zone(tz_name)
    except schedule.ScheduleError as exc:
        return None, [problem("$.schedule.timezone", str(exc))]
    try:
        if not isinstance(cron_text if text is None else text, str):
            raise schedule.ScheduleError("a string")
        jitter = 0
        if text is not None:
            parsed = schedule.parse_text(text)
            cron_text, interval = parsed.cron, parsed.interval_ms
            jitter = schedule.jitter_ms(monitor_id, interval)
        cron = schedule.parse_cron(str(cron_text))
        gap = schedule.shortest_gap_ms(cron, tz, now_ms)
        if gap is None and schedule.next_fire(cron, tz, now_ms) is None:
            raise schedule.ScheduleError("this schedule never fires")
    except schedule.ScheduleError as exc:
        return None, [problem(field, str(exc))]
    if gap is not None and gap < min_interval_ms:
        message = (f"runs every {gap // 1000} s; the minimum interval is"
                   f" {min_interval_ms // 1000} s ([monitors] min_interval)")  # fmt: skip
        return None, [problem(field, message)]
    return (cron.text, tz_name, jitter), []


def _webhook(raw: Any) -> tuple[dict[str, Any] | None, list[Problem]]:
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        return None, [problem("$.webhook", "an object with `url`")]
    events = raw.get("events") or list(EVENTS)
    if not isinstance(events, list) or any(e not in EVENTS for e in events):
        return None, [problem("$.webhook.events", f"a list of {', '.join(EVENTS)}")]
    body = {**raw, "events": events}
    try:
        spec = msgspec.convert(body, WebhookSpec)
    except (msgspec.ValidationError, ValueError) as exc:
        message, _, where = str(exc).rpartition(" - at `")
        if message and where.endswith("`"):
            return None, [problem("$.webhook" + where[1:-1], message)]
        return None, [problem("$.webhook", str(exc))]
    return msgspec.to_builtins(spec), []


def validate(raw: dict[str, Any], *, monitor_id: str, min_interval_ms: int, now_ms: int,
             browser: bool, default_limit: int, search: bool = False,
             llm: LlmCheck | None = None, update: bool = False, smtp: SmtpConfig | None = None,
             notify_targets: frozenset[str] = frozenset()) -> MonitorSpec:  # fmt: skip
    """The request's monitor definition; BadRequest naming every field that is wrong. `smtp`
    (the relay) and `notify_targets` (the configured targets' names) decide which
    `notification` is accepted."""
    keys = UPDATE_KEYS if update else CREATE_KEYS
    problems = [problem(f"$.{k}"[:200], "unrecognized key") for k in sorted(raw) if k not in keys]
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        problems.append(problem("$.name", f"required string of 1 to {MAX_NAME} characters"))
    sched, more = _schedule(raw.get("schedule"), monitor_id, min_interval_ms, now_ms)
    problems += more
    targets_raw = raw.get("targets")
    targets: list[dict[str, Any]] = []
    if not isinstance(targets_raw, list) or not 1 <= len(targets_raw) <= MAX_TARGETS:
        problems.append(problem("$.targets", f"a list of 1 to {MAX_TARGETS} targets"))
    else:
        seen: set[str] = set()
        for i, item in enumerate(targets_raw):
            target, more = _target(item, f"$.targets[{i}]", seen, browser=browser,
                                   default_limit=default_limit, search=search,
                                   llm=llm)  # fmt: skip
            problems += more
            if target is not None:
                targets.append(target)
    webhook, more = _webhook(raw.get("webhook"))
    problems += more
    notification, more = notify.parse(
        raw.get("notification"), smtp_ready=smtp is not None, targets=notify_targets,
        allows=smtp.allows if smtp is not None else lambda _: True,
    )  # fmt: skip
    problems += more
    retention = raw.get("retentionDays", DEFAULT_RETENTION_DAYS)
    if retention is None:
        retention = DEFAULT_RETENTION_DAYS
    if type(retention) is not int or not 1 <= retention <= MAX_RETENTION_DAYS:
        problems.append(
            problem("$.retentionDays", f"a whole number of days, 1 to {MAX_RETENTION_DAYS}")
        )
    goal = raw.get("goal")
    if goal is not None and (not isinstance(goal, str) or len(goal) > 2000):
        problems.append(problem("$.goal", "a string of at most 2000 characters"))
    judge = raw.get("judgeEnabled")
    if judge is not None and not isinstance(judge, bool):
        problems.append(problem("$.judgeEnabled", "a boolean"))
    if any(t["type"] == "search" for t in targets) and not goal and judge is not False:
        problems.append(problem("$.goal", NEEDS_GOAL))
    if problems:
        raise BadRequest(problems)
    assert sched is not None and isinstance(name, str)
    cron, tz_name, jitter = sched
    return MonitorSpec(
        name=name.strip(), cron=cron, timezone=tz_name, jitter_ms=jitter, targets=targets,
        webhook=webhook, notification=notification, retentionDays=retention,
        goal=goal or None, judgeEnabled=bool(goal) if judge is None else judge,
    )  # fmt: skip


def merged(spec: MonitorSpec, patch: dict[str, Any]) -> dict[str, Any]:
    """A PATCH body over the stored definition, as a whole create body (a given `schedule`
    replaces the stored one; omitted fields keep their values)."""
    body: dict[str, Any] = {
        "name": spec.name,
        "schedule": {"cron": spec.cron, "timezone": spec.timezone},
        "targets": spec.targets,
        "webhook": spec.webhook,
        "notification": spec.notification,
        "retentionDays": spec.retentionDays,
        "goal": spec.goal,
        "judgeEnabled": spec.judgeEnabled,
    }
    body.update({k: v for k, v in patch.items() if k != "status"})
    return body


def _iso(ms: int | None) -> str | None:
    return None if ms is None else iso_ms(ms)


def monitor_json(row: Any, spec: MonitorSpec) -> dict[str, Any]:
    """A monitor as Firecrawl answers it (`row` a store.MonitorRow)."""
    webhook = None
    if spec.webhook is not None:
        webhook = {
            **spec.webhook,
            "headers": {k: "[redacted]" for k in spec.webhook.get("headers") or {}},
        }
    return {
        "id": row.id, "name": spec.name, "status": row.status,
        "schedule": {"cron": spec.cron, "timezone": spec.timezone},
        "nextRunAt": _iso(row.next_run_ms if row.status == "active" else None),
        "lastRunAt": _iso(row.last_run_ms), "currentCheckId": row.current_check,
        "targets": spec.targets, "webhook": webhook, "notification": spec.notification,
        "retentionDays": spec.retentionDays, "estimatedCreditsPerMonth": 0,
        "lastCheckSummary": None if row.last_summary is None else decode_any(row.last_summary),
        "goal": spec.goal, "judgeEnabled": spec.judgeEnabled,
        "createdAt": iso_ms(row.created_ms), "updatedAt": iso_ms(row.updated_ms),
    }  # fmt: skip


EMPTY_SUMMARY = {"totalPages": 0, "same": 0, "changed": 0, "new": 0, "removed": 0, "error": 0}


def check_json(row: Any, notified: dict[str, str] | None = None) -> dict[str, Any]:
    """A check as Firecrawl answers it (`row` a store.CheckRow; `notified` its notifications'
    states by channel)."""
    notification = decode_spec(row.spec).notification
    finished = row.status not in ("queued", "running")
    return {
        "id": row.id, "monitorId": row.monitor_id, "status": row.status, "trigger": row.trigger,
        "scheduledFor": _iso(row.scheduled_ms), "startedAt": _iso(row.started_ms),
        "finishedAt": _iso(row.finished_ms), "estimatedCredits": 0, "actualCredits": 0,
        "billingStatus": "not_applicable",
        "summary": EMPTY_SUMMARY if row.summary is None else decode_any(row.summary),
        "targetResults": None if row.target_results is None else decode_any(row.target_results),
        "notificationStatus": notify.status_json(notification, notified or {}, finished),
        "error": row.error,
        "createdAt": iso_ms(row.created_ms), "updatedAt": iso_ms(row.updated_ms),
    }  # fmt: skip


def page_json(check_id: str, row: Any) -> dict[str, Any]:
    """A check's page (`row` a store.PageRow)."""
    out: dict[str, Any] = {
        "id": f"{check_id}:{row.n}", "targetId": row.target_id, "url": row.url,
        "status": row.status, "previousScrapeId": row.previous_scrape,
        "currentScrapeId": row.current_scrape, "statusCode": row.status_code,
        "error": row.error, "createdAt": iso_ms(row.created_ms),
        "metadata": None if row.metadata is None else decode_any(row.metadata),
    }  # fmt: skip
    if row.diff is not None:
        out["diff"] = decode_any(row.diff)
    if row.judgment is not None:
        out["judgment"] = decode_any(row.judgment)
    if row.snapshot is not None:
        out["snapshot"] = {"json": decode_any(row.snapshot)}
    return out


def page_event(monitor_id: str, check_id: str, row: Any) -> dict[str, Any]:
    """The one item of a `monitor.page` webhook's data."""
    diff = None if row.diff is None else {"text": decode_any(row.diff).get("text")}
    judgment = None if row.judgment is None else decode_any(row.judgment)
    return {
        "monitorId": monitor_id, "checkId": check_id, "url": row.url, "status": row.status,
        "previousScrapeId": row.previous_scrape, "currentScrapeId": row.current_scrape,
        "error": row.error, "isMeaningful": None if judgment is None else judgment["meaningful"],
        "judgment": judgment, "diff": diff,
    }  # fmt: skip


JUDGMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "meaningful": {"type": "boolean"},
        "confidence": {"type": "string", "enum": ["high", "medium", "low"]},
        "reason": {"type": "string"},
        "meaningfulChanges": {"type": "array", "items": {
            "type": "object",
            "properties": {"type": {"type": "string", "enum": ["added", "removed", "changed"]},
                           "before": {"type": ["string", "null"]},
                           "after": {"type": ["string", "null"]},
                           "reason": {"type": "string"}},
            "required": ["type", "reason"]}},
    },
    "required": ["meaningful", "confidence", "reason", "meaningfulChanges"],
}  # fmt: skip
"""What the judge answers for a changed page (Firecrawl's `judgment`)."""


def judge_prompt(goal: str) -> str:
    return (
        "The page content is a unified diff of a web page between two checks of a monitor."
        f" The monitor's goal: {goal}\nSay whether the change is meaningful for this goal"
        " (not noise such as dates, counters or ads), how confident you are, why, and list the"
        " meaningful changes."
    )


def judge_result_prompt(goal: str) -> str:
    return (
        "The content is a search result that a monitor's search target found for the first"
        f" time. The monitor's goal: {goal}\nSay whether this result is meaningful for this goal"
        " (not an unrelated or duplicate hit), how confident you are, why, and list what in it"
        " matters as `added` changes."
    )


def search_status(judgment: dict[str, Any] | None) -> str:
    """A new search result's `metadata.searchStatus`: `alert` unless the judge found it not
    meaningful for the goal (`watching`: kept, reported, not alerted on)."""
    return "watching" if judgment is not None and not judgment["meaningful"] else "alert"


def judgment_of(value: Any) -> dict[str, Any] | None:
    """The model's answer as a judgment, or None when it does not have the shape."""
    if not isinstance(value, dict) or not isinstance(value.get("meaningful"), bool):
        return None
    changes = [c for c in value.get("meaningfulChanges") or [] if isinstance(c, dict)
               and c.get("type") in ("added", "removed", "changed")]  # fmt: skip
    confidence = value.get("confidence")
    return {
        "meaningful": value["meaningful"],
        "confidence": confidence if confidence in ("high", "medium", "low") else "low",
        "reason": str(value.get("reason") or ""),
        "meaningfulChanges": [{"type": c["type"], "before": c.get("before"),
                               "after": c.get("after"), "reason": str(c.get("reason") or "")}
                              for c in changes],
    }  # fmt: skip
