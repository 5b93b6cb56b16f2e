# Discovery and ingest: newlist pages queue unseen aids in the store's ingest queue, and each
# queued aid leaves it in the transaction that stores its metadata, uploader and first
# snapshot (then it is handed to classification). Both run in one place at a time (FENCE).
from __future__ import annotations

import contextlib
import functools

import trio

from daemon.tracker import metrics, rules
from daemon.tracker import store as ts
from daemon.tracker.bilibili import BiliError, NoProxyAvailable, UpstreamError
from daemon.tracker.steps.base import (
    DISCOVERY_MAX_PAGES,
    DISCOVERY_PAGE_SIZE,
    NO_PROXY_INGEST_RETRY_MS,
    AlreadyTracked,
    TrackerBase,
    log,
)


class IngestSteps(TrackerBase):
    """Discovery, tracking by hand and ingest."""

    # ---- discovery and ingest ---------------------------------------------------------------

    async def discovery_pass(self) -> int:
        """Page through newlist until a page is empty or has no unseen aid; queue unseen aids
        for ingest. Returns how many were queued."""
        queued_total, page = 0, 1
        self.stats.discovery_error = None
        try:
            while page <= DISCOVERY_MAX_PAGES:
                answer = await self._when_room(
                    functools.partial(self.client.newlist, pn=page, ps=DISCOVERY_PAGE_SIZE)
                )
                aids = answer.value
                now = self.clock()
                queued = await self._write(
                    lambda c, a=aids, n=now: ts.enqueue_ingest(c, a, "discovery", n)  # type: ignore[misc]
                )
                queued_total += len(queued)
                if not rules.discovery_continues(aids, queued):
                    break
                page += 1
        except NoProxyAvailable as exc:
            metrics.no_proxy.labels(exc.task).inc()
            self.stats.discovery_error = "no proxy available"
        except BiliError as exc:
            metrics.upstream_errors.labels(str(exc.code)).inc()
            self.stats.discovery_error = str(exc)
        except UpstreamError as exc:
            metrics.upstream_errors.labels("network").inc()
            self.stats.discovery_error = str(exc)
        if self.stats.discovery_error:
            log.warning("discovery pass stopped early", error=self.stats.discovery_error, page=page)
        self.stats.discovery_last_ms = self.clock()
        self.stats.discovery_new = queued_total
        self.stats.discovery_pages = page
        self.stats.discovered_total += queued_total
        if queued_total:
            self.ingest_wakeup.set()
        return queued_total

    async def track(self, aid: int) -> None:
        """Queue `aid` for ingest (POST /tracker/videos); AlreadyTracked if known."""
        now = self.clock()
        queued = await self._write(lambda c: ts.enqueue_ingest(c, [aid], "api", now))
        if not queued:
            raise AlreadyTracked(aid)
        self.ingest_wakeup.set()

    async def ingest_pass(self, limit: int = 50) -> int:
        """Ingest the queued aids that are due; returns how many were handled."""
        now = self.clock()
        due = await self.store.read(lambda c: ts.due_ingest(c, now, limit))
        for aid, attempts in due:
            await self.ingest_one(aid, attempts)
        return len(due)

    async def next_ingest_ms(self) -> int | None:
        return await self.store.read(ts.next_ingest_ms)

    async def ingest_one(self, aid: int, attempts: int) -> None:
        try:
            answer = await self._when_room(functools.partial(self.client.view_detail, aid))
        except NoProxyAvailable as exc:
            metrics.no_proxy.labels(exc.task).inc()
            at = self.clock() + NO_PROXY_INGEST_RETRY_MS
            await self._write(lambda c: ts.delay_ingest(c, aid, at))
            return
        except BiliError as exc:
            code, message = exc.code, str(exc)
            metrics.upstream_errors.labels(str(code)).inc()
            now = self.clock()
            if exc.rate_limited:
                retry = rules.ingest_retry(attempts + 1, now)
                await self._write(lambda c: ts.ingest_failed(c, aid, message, retry))
                return
            log.info("video gone at ingest", aid=aid, code=code)
            await self._write(lambda c: ts.store_gone_video(c, aid, code, now))
            return
        except UpstreamError as exc:
            message = str(exc)
            metrics.upstream_errors.labels("network").inc()
            retry = rules.ingest_retry(attempts + 1, self.clock())
            if retry is None:
                log.warning("ingest gave up", aid=aid, attempts=attempts + 1, error=message)
            await self._write(lambda c: ts.ingest_failed(c, aid, message, retry))
            return
        detail, now = answer.value, self.clock()
        await self._write(lambda c: ts.store_video(c, detail, answer.server_ms, now))
        metrics.snapshots.labels("ingest").inc()
        self.stats.ingested += 1
        with contextlib.suppress(trio.WouldBlock):  # if full, the 5-min sweep picks it up
            self.classify_send.send_nowait(aid)
