# Classification: a stored video's text goes to the classifier; a song gets its label and its
# four `new` schedules in one transaction. A classifier that is down leaves the video for the
# sweep, which retries every video without a label.
from __future__ import annotations

from daemon.store import Conn
from daemon.tracker import rules
from daemon.tracker import store as ts
from daemon.tracker.steps.base import TrackerBase, log


class ClassifySteps(TrackerBase):
    """Labelling stored videos (one as it is ingested, the rest by the sweep)."""

    # ---- classification -----------------------------------------------------------------------

    async def classify_one(self, aid: int) -> bool | None:
        """Label a stored video; a song gets into songs with its four `new` schedules. Returns
        whether it is a song (None: not classified now — no text, or the classifier is down)."""
        text = await self.store.read(lambda c: ts.video_text(c, aid))
        if text is None:
            return None
        try:
            result = await self.classifier.classify(aid, text.title, text.description, text.tags)
        except self.classifier_errors as exc:
            log.warning("classifier unavailable; retried within 5 min", aid=aid, error=str(exc))
            return None
        now = self.clock()

        def tx(conn: Conn) -> bool:
            added = ts.store_label(
                conn, aid, result.label, result.probabilities, result.model_version, now
            )
            if added:
                for at in rules.new_schedule_times(now):
                    self._schedule(conn, aid, "new", at, now, force=True)
            return added

        added = await self._write(tx)
        self.stats.classified += 1
        if added:
            self.stats.songs_added += 1
            log.info("new song", aid=aid, label=result.label, title=text.title[:80])
        return result.label != 0

    async def classify_sweep(self) -> int:
        """Classify every ingested video without a label (any model version)."""
        done, after = 0, 0
        while True:
            batch = await self.store.read(lambda c, a=after: ts.unlabelled(c, a, 200))  # type: ignore[misc]
            if not batch:
                return done
            for text in batch:
                if await self.classify_one(text.aid) is None:
                    return done  # the classifier is down: the next sweep tries again
                done += 1
            after = batch[-1].aid
